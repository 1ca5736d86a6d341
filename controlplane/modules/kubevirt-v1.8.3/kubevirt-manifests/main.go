// Command kubevirt-manifests prints, as YAML, what virt-operator would install for virt-controller at this
// KubeVirt version: its CRDs (the install strategy's list, plus the KubeVirt CRD the operator's own
// manifest carries) and virt-controller's ServiceAccount, ClusterRole(Binding) and Role(Binding).
// It calls virt-operator's generators (pkg/virt-operator/resource/generate/{components,rbac}) unchanged,
// so the vendored YAML in upstream/kubevirt/<version>/ is KubeVirt's own, not a copy edited by hand.
package main

import (
	"fmt"
	"os"

	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/rbac"
)

// The order of install.GenerateCurrentInstallStrategy (pkg/virt-operator/resource/generate/install/strategy.go).
var crds = []func() (*extv1.CustomResourceDefinition, error){
	components.NewVirtualMachineInstanceCrd, components.NewPresetCrd, components.NewReplicaSetCrd,
	components.NewVirtualMachineCrd, components.NewVirtualMachineInstanceMigrationCrd,
	components.NewVirtualMachineSnapshotCrd, components.NewVirtualMachineSnapshotContentCrd,
	components.NewVirtualMachineRestoreCrd, components.NewVirtualMachineInstancetypeCrd,
	components.NewVirtualMachineClusterInstancetypeCrd, components.NewVirtualMachinePoolCrd,
	components.NewMigrationPolicyCrd, components.NewVirtualMachinePreferenceCrd,
	components.NewVirtualMachineClusterPreferenceCrd, components.NewVirtualMachineExportCrd,
	components.NewVirtualMachineCloneCrd, components.NewVirtualMachineBackupCrd,
	components.NewVirtualMachineBackupTrackerCrd,
	components.NewKubeVirtCrd,
}

func controllerRBAC(namespace string) []runtime.Object {
	// includeNADRules is !ExternalNetResourceInjectionEnabled(), false by default (strategy.go).
	return rbac.GetAllController(namespace, true)
}

func emit(object interface{}) {
	out, err := yaml.Marshal(object)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("---\n%s", out)
}

func main() {
	if len(os.Args) != 3 || (os.Args[1] != "crds" && os.Args[1] != "rbac") {
		fmt.Fprintln(os.Stderr, "usage: kubevirt-manifests crds|rbac NAMESPACE")
		os.Exit(2)
	}
	if os.Args[1] == "crds" {
		for _, make := range crds {
			crd, err := make()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			emit(crd)
		}
		return
	}
	for _, object := range controllerRBAC(os.Args[2]) {
		emit(object)
	}
}
