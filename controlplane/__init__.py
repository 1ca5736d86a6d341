"""A real Kubernetes control plane on loopback (kube-apiserver, etcd, kube-controller-manager), built from
the published Go modules in controlplane/modules/ and started for the tests, `make cluster` and `make run`."""
