//go:build tools

// Package tools pins Knative Serving's admission webhook, built unchanged from its published module, so
// deploy/'s Services are validated and defaulted by Serving's own code. Nothing else of Serving runs here:
// it needs pods and a network layer (see docs/control-plane.md).
package tools

import _ "knative.dev/serving/cmd/webhook"
