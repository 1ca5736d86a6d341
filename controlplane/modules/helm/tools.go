//go:build tools

// Package tools pins Helm's command-line client, built unchanged from its published module: `go build
// helm.sh/helm/v3/cmd/helm` inside this module uses the version and sums recorded here. The chart in
// deploy/chart/ is installed with it on the real control plane (tests/deploy/test_chart.py).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
