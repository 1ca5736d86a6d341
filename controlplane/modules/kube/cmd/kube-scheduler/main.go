// Command kube-scheduler is upstream's kube-scheduler, unchanged: this file only calls its entry point,
// built from Kubernetes' published modules like kube-apiserver beside it. It places the real node's pods
// (controlplane/node.py).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	command := app.NewSchedulerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
