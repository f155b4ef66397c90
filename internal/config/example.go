package config

import _ "embed"

//go:embed example.yaml
var example string

// Example returns a commented YAML configuration that sets every key to its default. A test
// decodes it strictly and compares it with Default, so the two can't drift apart.
func Example() string { return example }
