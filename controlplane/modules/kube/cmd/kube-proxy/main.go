// Command kube-proxy is upstream's kube-proxy, unchanged: this file only calls its entry point, built from
// Kubernetes' published modules like kube-apiserver beside it. It programs the real node's Service rules
// inside the node's network namespace (controlplane/node.py).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	command := app.NewProxyCommand()
	code := cli.Run(command)
	os.Exit(code)
}
