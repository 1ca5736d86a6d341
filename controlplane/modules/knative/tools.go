//go:build tools

// Package tools pins Knative Eventing's ApiServerSource receive adapter, built unchanged from its published
// module: `go build knative.dev/eventing/cmd/apiserver_receive_adapter` inside this module uses the version
// and sums recorded here (`go install …@version` fails: the proxy refuses the module's version list).
package tools

import _ "knative.dev/eventing/cmd/apiserver_receive_adapter"
