// Package kubernetes holds the tests of the Kubernetes example (its Dockerfile, Caddyfile and
// manifests/): every manifest decodes strictly into its Kubernetes API type, the manifests
// refer to each other and to the Caddyfile consistently, and the ConfigMap carries the shipped
// Caddyfile. It is a module of its own so that k8s.io/api stays out of the plugin's go.mod.
// That the Caddyfile adapts and validates is checked by the plugin's TestDocsCaddyfilesAdapt.
package kubernetes
