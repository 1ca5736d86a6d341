//go:build tools

// Package tools pins KubeVirt's commands, built unchanged from the published kubevirt.io/kubevirt module:
// `go build kubevirt.io/kubevirt/cmd/virt-controller` inside this module uses the version, the replace block
// (copied from kubevirt's own go.mod, which a dependent module does not inherit) and the sums recorded here.
// virt-controller serves every real-backend world; the others run the real node's KubeVirt (controlplane/node.py).
package tools

import (
	_ "kubevirt.io/kubevirt/cmd/virt-api"
	_ "kubevirt.io/kubevirt/cmd/virt-chroot"
	_ "kubevirt.io/kubevirt/cmd/virt-controller"
	_ "kubevirt.io/kubevirt/cmd/virt-freezer"
	_ "kubevirt.io/kubevirt/cmd/virt-handler"
	_ "kubevirt.io/kubevirt/cmd/virt-launcher"
	_ "kubevirt.io/kubevirt/cmd/virt-launcher-monitor"
	_ "kubevirt.io/kubevirt/cmd/virt-operator"
	_ "kubevirt.io/kubevirt/cmd/virt-probe"
	_ "kubevirt.io/kubevirt/cmd/virt-tail"
)
