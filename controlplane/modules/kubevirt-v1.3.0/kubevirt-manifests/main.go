// Command kubevirt-manifests prints, as YAML, what virt-operator would install for virt-controller at this
// KubeVirt version: its CRDs (the install strategy's list, plus the KubeVirt CRD the operator's own
// manifest carries) and virt-controller's ServiceAccount, ClusterRole(Binding) and Role(Binding).
// It calls virt-operator's generators (pkg/virt-operator/resource/generate/{components,rbac}) unchanged,
// so the vendored YAML in upstream/kubevirt/<version>/ is KubeVirt's own, not a copy edited by hand.
//
// `operator NAMESPACE REGISTRY TAG` prints the release's kubevirt-operator.yaml as KubeVirt's
// tools/manifest-templator renders manifests/release/kubevirt-operator.yaml.in: the namespace, the KubeVirt
// CRD, the priority class, the kubevirt.io:operator ClusterRole, virt-operator's RBAC and its Deployment,
// with the images at REGISTRY/<name>:TAG (the real node's, built locally: controlplane/images.py).
package main

import (
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	components.NewVirtualMachineCloneCrd,
	components.NewKubeVirtCrd,
}

func controllerRBAC(namespace string) []runtime.Object {
	return rbac.GetAllController(namespace)
}

func emit(object interface{}) {
	out, err := yaml.Marshal(object)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("---\n%s", out)
}

// The release manifest's parts that manifests/release/kubevirt-operator.yaml.in spells out itself.
func operatorStatic(namespace string) []interface{} {
	return []interface{}{
		&corev1.Namespace{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
			ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: map[string]string{
				"kubevirt.io": "", "pod-security.kubernetes.io/enforce": "privileged"}},
		},
		&rbacv1.ClusterRole{
			TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
			ObjectMeta: metav1.ObjectMeta{Name: "kubevirt.io:operator", Labels: map[string]string{
				"operator.kubevirt.io": "", "rbac.authorization.k8s.io/aggregate-to-admin": "true"}},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"kubevirt.io"}, Resources: []string{"kubevirts"},
				Verbs: []string{"get", "delete", "create", "update", "patch", "list", "watch", "deletecollection"}}},
		},
	}
}

func operator(namespace, registry, tag string) {
	objects := operatorStatic(namespace)
	crd, err := components.NewKubeVirtCrd()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	objects = append(objects, crd, components.NewKubeVirtPriorityClassCR())
	objects = append(objects, rbac.GetAllOperator(namespace)...)
	// As tools/manifest-templator's getOperatorDeploymentSpec: verbosity 2, the version from the tag, no digests.
	deployment, err := components.NewOperatorDeployment(namespace, registry, "", tag, "2", tag, "", "", "", "", "",
		"", "", "", "", "", "", "", "", "", "", "", "", "", "", "", corev1.PullIfNotPresent)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, object := range append(objects, deployment) {
		emit(object)
	}
}

func main() {
	if len(os.Args) == 5 && os.Args[1] == "operator" {
		operator(os.Args[2], os.Args[3], os.Args[4])
		return
	}
	if len(os.Args) != 3 || (os.Args[1] != "crds" && os.Args[1] != "rbac") {
		fmt.Fprintln(os.Stderr, "usage: kubevirt-manifests crds|rbac NAMESPACE | operator NAMESPACE REGISTRY TAG")
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
