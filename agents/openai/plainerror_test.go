package openai_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
)

// cloudflare502 is the page Cloudflare answers with when the origin behind it (the model
// server) fails: its title comes after the comments for old Internet Explorers, and its text
// names the request's Ray ID.
const cloudflare502 = `<!DOCTYPE html>
<!--[if lt IE 7]> <html class="no-js ie6 oldie" lang="en-US"> <![endif]-->
<!--[if IE 7]>    <html class="no-js ie7 oldie" lang="en-US"> <![endif]-->
<!--[if IE 8]>    <html class="no-js ie8 oldie" lang="en-US"> <![endif]-->
<!--[if gt IE 8]><!--> <html class="no-js" lang="en-US"> <!--<![endif]-->
<head>
<title>llm.example.com | 502: Bad gateway</title>
<meta charset="UTF-8" />
<meta name="robots" content="noindex, nofollow" />
<link rel="stylesheet" id="cf_styles-css" href="/cdn-cgi/styles/main.css" />
<style>body{margin:0;padding:0} .cf-error-title{font-size:60px}</style>
</head>
<body>
<div id="cf-wrapper">
<div id="cf-error-details" class="p-0">
<header class="mx-auto pt-10 lg:pt-6 lg:px-8 w-240 lg:w-full mb-8">
<h1 class="inline-block sm:block sm:mb-2 font-light text-60 lg:text-4xl text-black-dark leading-tight mr-2">
<span class="inline-block">Bad gateway</span>
<span class="code-label">Error code 502</span>
</h1>
<div>Visit <a href="https://www.cloudflare.com/5xx-error-landing">cloudflare.com</a> for more information.</div>
</header>
<p>The web server reported a bad gateway error.</p>
<span class="cf-footer-item">Cloudflare Ray ID: <strong class="font-semibold">8a1b2c3d4e5f6789</strong></span>
<script>(function(){var b=document.getElementById("cf-footer-ip-reveal");b.addEventListener("click",function(){});})();</script>
</div></div></body></html>
`

// nginx503 is nginx's own page for a 503.
const nginx503 = "<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n<body>\r\n<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n<hr><center>nginx/1.27.3</center>\r\n</body>\r\n</html>\r\n"

// TestErrorBodyThatIsNoJSON: an error status whose body is no JSON error, a model server's
// plain text (PyTorch's "CUDA out of memory" as a 500) or a proxy's page (HTML, on a 502, 503
// or 504), is a fault of the server when the status is 5xx: retried with the backoff and as
// often as any server error, counted as one, and when the retries run out the turn fails with
// the server's text in its error, quoted, a page's as its reader sees it (its title and text,
// without markup, comments, styles or scripts), bounded, so that the operator reads what
// answered. A 4xx of plain text stays a refusal, told the user as one, its text quoted alike.
// Before, the text stood unquoted in the error, and a page's markup filled the 200 characters
// kept of it: Cloudflare's page said nothing but its comments for old Internet Explorers. The
// retries held before (a guard).
func TestErrorBodyThatIsNoJSON(t *testing.T) {
	for _, tc := range []struct {
		name        string
		code        int
		contentType string
		body        string
		want        string // in the error
		requests    int
		result      string // of each request
		refusal     bool
	}{
		{"CUDA out of memory", 500, "text/plain; charset=utf-8",
			"CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.65 GiB total capacity; 21.02 GiB already allocated)\n",
			`500 Internal Server Error: "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.65 GiB total capacity; 21.02 GiB already allocated)"`,
			4, openai.ResultServerError, false},
		{"Cloudflare's 502 page", 502, "text/html; charset=UTF-8", cloudflare502,
			`502 Bad Gateway, a web page that reads "llm.example.com | 502: Bad gateway Bad gateway Error code 502 Visit cloudflare.com for more information. The web server reported a bad gateway error. Cloudflare Ray ID: 8a1b2c3d4e5f6789"`,
			4, openai.ResultServerError, false},
		{"nginx's 503 page", 503, "text/html", nginx503,
			`503 Service Unavailable, a web page that reads "503 Service Temporarily Unavailable 503 Service Temporarily Unavailable nginx/1.27.3"`,
			4, openai.ResultServerError, false},
		{"Envoy's 504", 504, "text/plain", "upstream request timeout",
			`504 Gateway Timeout: "upstream request timeout"`,
			4, openai.ResultServerError, false},
		{"a 400 of plain text", 400, "text/plain; charset=utf-8", "Failed to parse the request body as JSON: messages[0].content: invalid type\n",
			`400 Bad Request: "Failed to parse the request body as JSON: messages[0].content: invalid type"`,
			1, openai.ResultRefused, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.contentType)
				w.WriteHeader(tc.code)
				io.WriteString(w, tc.body)
			})
			sl := &sleeps{}
			var mu sync.Mutex
			var results []string
			a := MustAgent(t, m, nil, sl, func(c *openai.Config) {
				c.Requests = func(r string) { mu.Lock(); results = append(results, r); mu.Unlock() }
			})
			_, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run error = %v, want one holding %s", err, tc.want)
			}
			if _, isRef := errors.AsType[*agents.Refusal](err); isRef != tc.refusal {
				t.Errorf("Run error = %v: a Refusal %v, want %v", err, isRef, tc.refusal)
			}
			if strings.ContainsAny(err.Error(), "<>") {
				t.Errorf("Run error = %v, want it without markup", err)
			}
			var waits []time.Duration
			if tc.requests > 1 {
				waits = []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}
			}
			mu.Lock()
			defer mu.Unlock()
			if m.Count() != tc.requests || !slices.Equal(sl.waits(), waits) || len(results) != tc.requests || slices.ContainsFunc(results, func(r string) bool { return r != tc.result }) {
				t.Errorf("the model got %d requests, after waits %v, counted %q; want %d, after %v, each %q",
					m.Count(), sl.waits(), results, tc.requests, waits, tc.result)
			}
		})
	}
}

// TestColourCodesAreTakenOut: the ANSI escape sequences of a server that logs in colour (a
// Python engine's traceback, a Rust server's tracing line), in its error's message (JSON's
// "\u001b"), in a plain-text body (the ESC byte itself) or in a stream's error event, are taken
// out of the message the user's notice and the operator's log line are made of, and so are the
// remains of colour codes whose ESC a proxy or logger dropped or printed ("[31m", "^[[0m"); an
// index such as "[5m]" is text, and so are such codes that none resets ("retry in [5m0s]",
// which before read "retry in 0s]") and those whose bracket a "]" closes, also beside codes
// that reset (before, "retry in [5m0s]" still read "retry in 0s]" next to "[33mWARN[0m", and
// lost its "[5m" and a literal "[0m" with it). Before, the ESC became a space and the rest
// stayed: "[31mERROR [0m: …".
func TestColourCodesAreTakenOut(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer http.HandlerFunc
		want   string // the StatusError's message
	}{
		{"in a JSON error", openaitest.Status(500, `{"error":{"message":"\u001b[31mERROR\u001b[0m: worker \u001b[1;33mgpu-0\u001b[0m died\u001b[2K"}}`),
			"ERROR: worker gpu-0 died"},
		{"in a plain-text body", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "\x1b[38;5;208mWARN\x1b[0m engine \x1b]8;;https://docs.example.com/oom\x07busy\x1b]8;;\x1b\\ \x1b(Bretry later\n")
		}, "WARN engine busy retry later"},
		{"in a stream's error event", openaitest.Raw("text/event-stream", "event: error\ndata: \x1b[1m\x1b[31merror\x1b[39m\x1b[22m: CUDA out of memory\n\n"),
			"error: CUDA out of memory"},
		{"printed", openaitest.Status(502, `{"error":{"message":"[31mERROR[0m: upstream ^[[1;31mllama^[[0m gone, ␛[33mslot[0m [5m] of [10m]"}}`),
			"ERROR: upstream llama gone, slot [5m] of [10m]"},
		{"text that reads as codes without their reset", openaitest.Status(503, `{"error":{"message":"rate window [1m, 5m] exceeded: retry in [5m0s]"}}`),
			"rate window [1m, 5m] exceeded: retry in [5m0s]"},
		{"text that reads as codes beside codes", openaitest.Status(503, `{"error":{"message":"[33mWARN[0m rate window [1m, 5m] exceeded: retry in [5m0s]"}}`),
			"WARN rate window [1m, 5m] exceeded: retry in [5m0s]"},
		{"a key after a hyperlink", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, "bad key, see link\x1b]8;;https://docs.example.com/keys\x1b\\sk-proj0123456789abcdef\x1b]8;;\x1b\\ refused\n")
		}, "bad key, see link[redacted] refused"},
		{"text that reads as a code beside a literal reset", openaitest.Status(400, `{"error":{"message":"retry in [5m0s]; the terminal was reset with [0m"}}`),
			"retry in [5m0s]; the terminal was reset with [0m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, tc.answer)
			var logs bytes.Buffer
			a := MustAgent(t, m, &logs, nil, func(c *openai.Config) { c.MaxRetries = 1 })
			_, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}, Partial: func(string) {}})
			se, ok := errors.AsType[*openai.StatusError](err)
			if !ok || se.Message != tc.want {
				t.Fatalf("Run error = %v, want a StatusError whose message is %q", err, tc.want)
			}
			if strings.Contains(logs.String(), "[31m") || strings.Contains(logs.String(), "\\x1b") || strings.Contains(logs.String(), "\x1b") {
				t.Errorf("logs hold a colour code:\n%s", logs.String())
			}
		})
	}
}

// TestKeyCutInTheQuotedTextIsNotShown: the endpoint's text an error quotes is cut (sanitize
// reads its first 4 KiB, an error status's body is read to 16 KiB) where a word ends, never
// through the key: its first characters, which no rule redacts (the key of a server that
// takes any, such as vLLM's --api-key, has no prefix redact knows), are not shown when what
// comes before it is taken out (space, markup). Before, a stream's chunk that is no JSON and
// a 200's body that is no completion were cut at 512 bytes before the key was redacted, and an
// error page at the 16 KiB read, and the error showed the key's first 15 characters.
func TestKeyCutInTheQuotedTextIsNotShown(t *testing.T) {
	const key = "local-7Qm2Zp9Xc4Vb8Nn1Kd6Hj3Ty5Rw0" // no prefix redact knows, under 40 characters
	at := func(n int, before string) string { return strings.Repeat(" ", n-len(before)) + before + key }
	page := "<html><body><!--" + strings.Repeat("x", 16<<10) + "-->"
	page = page[:16<<10-len("--><p>bad key ")-15] + "--><p>bad key " + key + "</p></body></html>"
	for _, tc := range []struct {
		name   string
		answer http.HandlerFunc
		stream bool
		want   string
	}{
		{"a stream's chunk that is no JSON", openaitest.Raw("text/event-stream", "data: "+at(497, "bad key ")+"\n\n"), true, "stream chunk is not a chat completion"},
		{"a 200's body that is no completion", openaitest.Raw("text/plain", at(497, "bad key ")), false, "response is not a chat completion"},
		{"a 502's page", openaitest.Status(http.StatusBadGateway, page), false, `a web page that reads "bad key"`},
		{"a stream's error event (a guard)", openaitest.Raw("text/event-stream", "event: error\ndata: "+at(4<<10-15, "bad key ")+"\n\n"), true, `"bad key`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OPENAI_OTHER_KEY", key)
			m := newFakeModel(t, tc.answer)
			a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.APIKeyEnv, c.MaxRetries = "OPENAI_OTHER_KEY", 0 })
			req := &agents.Request{Messages: []agents.Message{msg("user", "hi")}}
			if tc.stream {
				req.Partial = func(string) {}
			}
			_, err := a.Run(t.Context(), req)
			if err != nil && strings.Contains(err.Error(), key[:8]) {
				t.Fatalf("Run error = %v, shows the start of the key %q", err, key)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run error = %v, want one holding %s", err, tc.want)
			}
		})
	}
}

// oauth2ProxySignIn is the page oauth2-proxy answers a request without its session's cookie
// with (a 200 when its --skip-provider-button is off): a proxy that guards the endpoint.
const oauth2ProxySignIn = `<!DOCTYPE html>
<html lang="en" charset="utf-8">
  <head>
    <meta charset="utf-8">
    <meta name="viewport" content="width=device-width, initial-scale=1, shrink-to-fit=no">
    <title>Sign In</title>
    <link rel="stylesheet" href="https://cdn.jsdelivr.net/npm/bulma@0.9.3/css/bulma.min.css">
    <style>
      body { height: 100vh; }
      .sign-in-box { max-width: 400px; margin: 1.25rem auto; }
    </style>
  </head>
  <body class="has-background-light">
  <section class="section">
    <div class="box block sign-in-box has-text-centered">
      <form method="GET" action="/oauth2/start">
        <input type="hidden" name="rd" value="/v1/chat/completions">
        <button type="submit" class="button block is-primary">Sign in with Google</button>
      </form>
    </div>
  </section>
  <script>
    if (window.location.hash) { (function() { var inputs = document.getElementsByName('rd'); })(); }
  </script>
  <footer>Secured with <a href="https://github.com/oauth2-proxy/oauth2-proxy#oauth2_proxy">OAuth2 Proxy</a> version 7.6.0</footer>
  </body>
</html>
`

// captivePortal is a hotel network's page, which its gateway answers every HTTP request
// with until the guest logs in (a model endpoint over plain HTTP, from a laptop).
const captivePortal = "<html><head><title>Welcome to Harbour Hotel Wi-Fi</title>" +
	"<meta http-equiv=\"refresh\" content=\"5; url=http://portal.example.net/login\"></head>" +
	"<body><h1>Welcome!</h1><p>Please accept the terms of use &amp; log in to reach the Internet.</p></body></html>"

// TestWebPageAnsweredWith200IsQuotedAsItsReaderSeesIt: a 200 whose body is a web page in
// place of a chat completion (a proxy's login page, a captive portal's) fails the turn with
// an error that quotes the page as an error status's page is quoted (bodyText): its title and
// text, without markup, styles or scripts, with its entities decoded; streamed or not. Before,
// it quoted the page's first 200 characters, its doctype, head and styles, which said nothing
// of the sign-in it asks for.
func TestWebPageAnsweredWith200IsQuotedAsItsReaderSeesIt(t *testing.T) {
	for _, tc := range []struct {
		name, page string
		stream     bool
		want       string
	}{
		{"oauth2-proxy's sign-in page", oauth2ProxySignIn, false,
			`a web page (Content-Type "text/html; charset=utf-8") that reads "Sign In Sign in with Google Secured with OAuth2 Proxy version 7.6.0"`},
		{"oauth2-proxy's sign-in page, streaming", oauth2ProxySignIn, true,
			`that reads "Sign In Sign in with Google Secured with OAuth2 Proxy version 7.6.0"`},
		{"a captive portal", captivePortal, false,
			`that reads "Welcome to Harbour Hotel Wi-Fi Welcome! Please accept the terms of use & log in to reach the Internet."`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, openaitest.Raw("text/html; charset=utf-8", tc.page))
			a := MustAgent(t, m, nil, nil, nil)
			req := &agents.Request{Messages: []agents.Message{msg("user", "hi")}}
			if tc.stream {
				req.Partial = func(string) {}
			}
			_, err := a.Run(t.Context(), req)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run error = %v, want one holding %s", err, tc.want)
			}
			if strings.ContainsAny(err.Error(), "<>{}") {
				t.Errorf("Run error = %v, want it without markup or styles", err)
			}
			if ref, ok := errors.AsType[*agents.Refusal](err); !ok || !strings.Contains(ref.Notice, "web page") {
				t.Errorf("Run error = %v, want a Refusal that names a web page", err)
			}
		})
	}
}

// TestErrorBodyAfterAByteOrderMark: an error status's body that starts with a byte order mark
// (a server or proxy on Windows, or one that writes its JSON with one) is read as what follows
// it, as a 200's body is: a JSON error's message, unquoted, and the parameter it names, which
// adapt does without; a page's text, or plain text, without the mark. Before, the JSON error
// was read as text that is no JSON: quoted whole, braces and all, and its param unread.
func TestErrorBodyAfterAByteOrderMark(t *testing.T) {
	const bom = "\uFEFF"
	for _, tc := range []struct {
		name, body string
		want       string // the StatusError's message
		requests   int
	}{
		{"a JSON error", bom + `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`,
			"Rate limit reached for requests", 1},
		{"a page", bom + nginx503, "503 Service Temporarily Unavailable 503 Service Temporarily Unavailable nginx/1.27.3", 1},
		{"plain text", bom + "upstream request timeout", "upstream request timeout", 1},
		{"a parameter refused", bom + `{"error":{"message":"Invalid request.","type":"invalid_request_error","param":"stream_options","code":"unsupported_parameter"}}`,
			"", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			steps := []http.HandlerFunc{openaitest.Status(http.StatusServiceUnavailable, tc.body)}
			if tc.requests == 2 {
				steps = []http.HandlerFunc{openaitest.Status(http.StatusBadRequest, tc.body), openaitest.Reply("hello", 3, 1)}
			}
			m := newFakeModel(t, steps...)
			a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.MaxRetries = 0 })
			resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}, Partial: func(string) {}})
			if tc.requests == 2 {
				// Refused for stream_options (its param alone names it), which the request
				// sent again does without.
				if err != nil || resp.Text != "hello" || m.Count() != 2 {
					t.Fatalf("Run = %+v, %v after %d requests, want the reply of the request sent again without stream_options", resp, err, m.Count())
				}
				return
			}
			se, ok := errors.AsType[*openai.StatusError](err)
			if !ok || se.Message != tc.want {
				t.Fatalf("Run error = %v, want a StatusError whose message is %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "{") || strings.Contains(err.Error(), `\ufeff`) || strings.Contains(err.Error(), bom) {
				t.Errorf("Run error = %q, want the mark and the JSON left out", err)
			}
		})
	}
}
