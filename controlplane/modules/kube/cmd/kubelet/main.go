// Command kubelet is upstream's kubelet, unchanged: this file only calls its entry point, built from
// Kubernetes' published modules like kube-apiserver beside it. It runs the real node's pods
// (controlplane/node.py) on containerd.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	command := app.NewKubeletCommand()
	code := cli.Run(command)
	os.Exit(code)
}
