// Command kube-apiserver is upstream's kube-apiserver, unchanged: this file only calls its entry point,
// so that the binary can be built from Kubernetes' published modules (see ../../go.mod for why a wrapper
// module is needed at all).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	command := app.NewAPIServerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
