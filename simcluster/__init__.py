"""A simulated Kubernetes + KubeVirt + Knative, for the tests and the `make run` demo.

Nothing here is shipped: the functions only ever see a real API server over HTTP (this one
speaks the same protocol to the real `kubernetes` client) and real CloudEvents over HTTP.
"""
