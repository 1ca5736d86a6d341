//go:build tools

// Package tools pins KubeVirt's virt-controller, built unchanged from the published kubevirt.io/kubevirt
// module: `go build kubevirt.io/kubevirt/cmd/virt-controller` inside this module uses the version, the
// replace block (copied from kubevirt's own go.mod, which a dependent module does not inherit) and the sums
// recorded here.
package tools

import _ "kubevirt.io/kubevirt/cmd/virt-controller"
