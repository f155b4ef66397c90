package openai

import "testing"

// TestRefusalKey: refusalKey takes out what differs from one request to the next (per-request
// ids of any alphabet, named or not) and keeps what tells refusals apart (words, parameter
// names, counts of fewer than 16 digits).
func TestRefusalKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b string
		same bool
	}{
		{"Cloudflare's Ray ID", "Ray ID: 8a1b2c3d4e5f0001-FRA", "Ray ID: 8a1b2c3d4e5f0002-AMS", true},
		{"a UUID", "request 1a2b0001-1c2d-4e5f-8a9b-c0ffee000001 failed", "request 1a2b0002-1c2d-4e5f-8a9b-c0ffee000002 failed", true},
		{"one-api's decimal id", "bad request (request id: 2025120712345678901234567)", "bad request (request id: 2025120712345679012345678)", true},
		{"new-api's id", "bad request (request id: 20251207073841123456789aB3xYz9Q)", "bad request (request id: 2025120707384298765Qw7ZkLmNp)", true},
		{"an id cut short with the message", "bad request (request id: 2025120707…", "bad request (request id: 2025120708…", true},
		{"Anthropic's request_id as JSON", `{"message":"Error"},"request_id":"req_011CZACayYzvBK2dtytcvDpD"}`, `{"message":"Error"},"request_id":"req_011CUzbiD3p8rokhqWtP6EWX"}`, true},
		{"Anthropic's request_id as Python's repr", "'request_id': 'req_011CZACayYzvBK2dtytcvDpD'", "'request_id': 'req_011CUzbiD3p8rokhqWtP6EWX'", true},
		{"an id not named", "failed: req_011CZACayYzvBK2dtytcvDpD", "failed: req_011CUzbiD3p8rokhqWtP6EWX", true},
		{"x-request-id", "x-request-id=ab12cd", "x-request-id=ef34gh", true},
		{"a message's index", "messages.3: text content blocks must be non-empty", "messages.1: text content blocks must be non-empty", false},
		{"n_ctx", "request (4476 tokens) exceeds the available context size (4096 tokens)", "request (4476 tokens) exceeds the available context size (8192 tokens)", false},
		{"a long count", "n_ctx 123456789012345 is too many", "n_ctx 123456789012346 is too many", false},
		{"a word after an id's name", "request id: missing, model unknown", "request id: missing, model known", false},
		{"a parameter's name", "Unknown parameter: 'stream_options_include_usage'", "Unknown parameter: 'stream_options_include_tokens'", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ka, kb := refusalKey(tc.a), refusalKey(tc.b)
			if (ka == kb) != tc.same {
				t.Errorf("refusalKey(%q) = %q, refusalKey(%q) = %q; same: %v, want %v", tc.a, ka, tc.b, kb, ka == kb, tc.same)
			}
		})
	}
}
