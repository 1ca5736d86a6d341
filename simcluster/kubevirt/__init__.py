"""A simulated KubeVirt, one module per real component it stands in for.

- `objects`: KubeVirt's API types as every part reads them (names, labels, phases, conditions; no decisions);
- `vm_controller`: virt-controller's VM controller (run strategies, the VM's status);
- `vmi_controller`: virt-controller's VMI controller and the virt-launcher pod it renders;
- `scheduler`: kube-scheduler placing launcher pods;
- `node`: a node's kubelet and virt-handler (pod phases, guest start, shutdown, power-off and crash);
- `migration`: virt-handler and virt-launcher in a live migration;
- `io_faults`: virt-launcher and virt-handler when a guest's disk fails IO;
- `client`: client-go, every API call the parts make;
- `sim`: `KubeVirtSim`, the installation's watches and work queue, composed of the parts above.

Where KubeVirt's real virt-controller runs (`node_only`, the real control plane) only `node`, `scheduler`,
`migration` and `io_faults` act. docs/facts.md §1–3 is the summary.
"""
