{{- /* Generated from the functions' declarations by `make generate` (catalog/chart.py): edit their
declaration.py, never this file. Each grant scoped by a namespaces setting: the name of its
ClusterRoleBinding, and the Knative Service and the setting that scope it. */ -}}
{{- define "vmevents.scoped" -}}
vmevents-vmi-cleanup-act: [vmi-cleanup, CLEANUP_NAMESPACES]
vmevents-migration-report-act: [migration-report, MIGRATION_NAMESPACES]
{{- end -}}
