package kubernetes

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// The kinds the example ships, by apiVersion/kind. A manifest of any other kind is an error,
// so that a new one is added here and decoded strictly too.
var kinds = map[string]func() any{
	"v1/ConfigMap":                       func() any { return new(corev1.ConfigMap) },
	"v1/Secret":                          func() any { return new(corev1.Secret) },
	"v1/Service":                         func() any { return new(corev1.Service) },
	"apps/v1/Deployment":                 func() any { return new(appsv1.Deployment) },
	"networking.k8s.io/v1/NetworkPolicy": func() any { return new(networkingv1.NetworkPolicy) },
	"policy/v1/PodDisruptionBudget":      func() any { return new(policyv1.PodDisruptionBudget) },
}

type manifest struct {
	where string // file:document
	obj   any
}

// decodeStrict decodes one YAML document into its API type: duplicate keys and fields the
// type does not have are errors (what `kubectl apply --validate=strict` refuses on a server,
// checked here without one: schema validators that download schemas cannot run offline).
func decodeStrict(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, err
	}
	if tm.APIVersion == "" || tm.Kind == "" {
		return nil, fmt.Errorf("no apiVersion or kind")
	}
	newObj, ok := kinds[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return nil, fmt.Errorf("kind %s/%s is not one the test knows", tm.APIVersion, tm.Kind)
	}
	obj := newObj()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// documents splits a multi-document YAML file on its "---" lines, leaving out documents that
// hold only comments.
func documents(text []byte) [][]byte {
	var out [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(text), -1) {
		for _, line := range strings.Split(d, "\n") {
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
				out = append(out, []byte(d))
				break
			}
		}
	}
	return out
}

func loadManifests(t *testing.T) []manifest {
	t.Helper()
	files, err := filepath.Glob("manifests/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests/*.yaml (%v)", err)
	}
	var out []manifest
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range documents(text) {
			where := f + ":" + strconv.Itoa(i+1)
			obj, err := decodeStrict(doc)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			out = append(out, manifest{where, obj})
		}
	}
	return out
}

func TestManifestsDecodeStrictly(t *testing.T) {
	ms := loadManifests(t)
	want := []string{
		"ConfigMap/kvroute-caddyfile", "Secret/kvroute-cluster", "Deployment/kvroute",
		"Service/kvroute", "PodDisruptionBudget/kvroute", "Deployment/nats", "Service/nats",
		"NetworkPolicy/nats", "Service/vllm", "Deployment/vllm",
	}
	var got []string
	for _, m := range ms {
		got = append(got, reflect.TypeOf(m.obj).Elem().Name()+"/"+m.obj.(metav1.Object).GetName())
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("objects:\n got %v\nwant %v", got, want)
	}
}

// The strict decoding must itself refuse what a typo produces, or the test above proves nothing.
func TestStrictDecodingRefusesTypos(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"unknown field", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replicass: 3\n", `unknown field "replicass"`},
		{"nested unknown field", "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ports:\n    - port: 80\n      targetPortt: http\n", `unknown field "targetPortt"`},
		{"duplicate key", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  name: y\n", `"name" already set`},
		{"wrong type", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replicas: three\n", "cannot unmarshal string"},
		{"unknown kind", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n", "not one the test knows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeStrict([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("decodeStrict: %v; want an error with %q", err, tc.want)
			}
		})
	}
}

func TestConfigMapCarriesTheShippedCaddyfile(t *testing.T) {
	want, err := os.ReadFile("Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	cm := find[*corev1.ConfigMap](t, loadManifests(t), "kvroute-caddyfile")
	if got := cm.Data["Caddyfile"]; got != string(want) {
		t.Errorf("ConfigMap kvroute-caddyfile's Caddyfile differs from examples/kubernetes/Caddyfile at line %d; copy the file into the ConfigMap", firstDiffLine(got, string(want)))
	}
}

// TestManifestsFitTogether checks what kubectl would accept but would not work: a Service
// selecting no pods or naming a port no container has, a reference to a missing ConfigMap or
// Secret key, the Caddyfile naming a Service or environment variable that the manifests do not
// provide.
func TestManifestsFitTogether(t *testing.T) {
	ms := loadManifests(t)
	caddyfile, err := os.ReadFile("Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	deployments := all[*appsv1.Deployment](ms)
	services := all[*corev1.Service](ms)

	podsOf := func(sel labels.Selector) []*appsv1.Deployment {
		var out []*appsv1.Deployment
		for _, d := range deployments {
			if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				out = append(out, d)
			}
		}
		return out
	}
	for _, d := range deployments {
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("Deployment %s: its selector does not match its pod template's labels (%v)", d.Name, err)
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
				if p != nil && p.HTTPGet != nil && !hasPort(c, p.HTTPGet.Port.String()) {
					t.Errorf("Deployment %s: a probe of container %s names port %s, which it does not have", d.Name, c.Name, p.HTTPGet.Port.String())
				}
			}
			for _, e := range c.Env {
				if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil {
					s := find[*corev1.Secret](t, ms, r.SecretKeyRef.Name)
					if _, ok := s.StringData[r.SecretKeyRef.Key]; !ok {
						t.Errorf("Deployment %s: env %s reads key %q, which Secret %s does not have", d.Name, e.Name, r.SecretKeyRef.Key, s.Name)
					}
				}
			}
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.ConfigMap != nil {
				find[*corev1.ConfigMap](t, ms, v.ConfigMap.Name)
			}
		}
	}
	for _, s := range services {
		pods := podsOf(labels.SelectorFromSet(s.Spec.Selector))
		if len(pods) != 1 {
			t.Errorf("Service %s selects the pods of %d Deployments, want 1", s.Name, len(pods))
			continue
		}
		for _, p := range s.Spec.Ports {
			if !hasPort(pods[0].Spec.Template.Spec.Containers[0], p.TargetPort.String()) {
				t.Errorf("Service %s: targetPort %s is no port of Deployment %s", s.Name, p.TargetPort.String(), pods[0].Name)
			}
		}
	}
	for _, np := range all[*networkingv1.NetworkPolicy](ms) {
		sel, _ := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if len(podsOf(sel)) != 1 {
			t.Errorf("NetworkPolicy %s selects the pods of %d Deployments, want 1", np.Name, len(podsOf(sel)))
		}
		for _, in := range np.Spec.Ingress {
			for _, from := range in.From {
				sel, _ := metav1.LabelSelectorAsSelector(from.PodSelector)
				if len(podsOf(sel)) != 1 {
					t.Errorf("NetworkPolicy %s admits the pods of %d Deployments, want 1", np.Name, len(podsOf(sel)))
				}
			}
		}
	}

	// The Caddyfile's upstreams: `dynamic a NAME PORT` must name a headless Service with that port
	// (a Service with a cluster IP answers one virtual address, and every request would look
	// like one upstream).
	dyn := regexp.MustCompile(`(?m)^\s*dynamic a (\S+) (\d+)`).FindAllStringSubmatch(string(caddyfile), -1)
	if len(dyn) == 0 {
		t.Error("the Caddyfile has no `dynamic a NAME PORT` upstreams")
	}
	for _, m := range dyn {
		s := find[*corev1.Service](t, ms, m[1])
		if s.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("Service %s: clusterIP %q, want None (headless) for `dynamic a`", s.Name, s.Spec.ClusterIP)
		}
		if !servicePort(s, m[2]) {
			t.Errorf("Service %s has no port %s, which the Caddyfile dials", s.Name, m[2])
		}
	}
	nats := regexp.MustCompile(`(?m)^\s*cluster nats://([^:\s]+):(\d+)`).FindStringSubmatch(string(caddyfile))
	if nats == nil {
		t.Fatal("the Caddyfile has no `cluster nats://HOST:PORT`")
	}
	if s := find[*corev1.Service](t, ms, nats[1]); !servicePort(s, nats[2]) {
		t.Errorf("Service %s has no port %s, which the Caddyfile's cluster dials", s.Name, nats[2])
	}

	// Every environment variable the Caddyfile reads is set in the Caddy container.
	caddy := find[*appsv1.Deployment](t, ms, "kvroute").Spec.Template.Spec.Containers[0]
	for _, m := range regexp.MustCompile(`\{env\.([A-Za-z0-9_]+)\}`).FindAllStringSubmatch(string(caddyfile), -1) {
		if !slices.ContainsFunc(caddy.Env, func(e corev1.EnvVar) bool { return e.Name == m[1] }) {
			t.Errorf("the Caddyfile reads {env.%s}, which Deployment kvroute does not set", m[1])
		}
	}
	// The Caddyfile's ports are the container's.
	for _, m := range regexp.MustCompile(`(?m)^:(\d+) \{`).FindAllStringSubmatch(string(caddyfile), -1) {
		if !hasPort(caddy, m[1]) {
			t.Errorf("the Caddyfile listens on :%s, which Deployment kvroute's container does not declare", m[1])
		}
	}
}

// The Dockerfile builds what xcaddy.sh builds (the same xcaddy and Caddy, the Go of go.mod) and
// runs Caddy as the Deployment does; nothing in CI builds the image, so drift shows here.
func TestDockerfileMatchesTheBuild(t *testing.T) {
	docker := read(t, "Dockerfile")
	script := read(t, "../../xcaddy.sh")
	gomod := read(t, "../../go.mod")
	for _, name := range []string{"XCADDY_VERSION", "CADDY_VERSION"} {
		inDocker := regexp.MustCompile(`(?m)^ARG ` + name + `=(\S+)$`).FindStringSubmatch(docker)
		inScript := regexp.MustCompile(name + `=\$\{` + name + `:-(\S+)\}`).FindStringSubmatch(script)
		if inDocker == nil || inScript == nil || inDocker[1] != inScript[1] {
			t.Errorf("%s: Dockerfile %v, xcaddy.sh %v", name, inDocker, inScript)
		}
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(gomod)
	if goVersion == nil || !strings.Contains(docker, "FROM golang:"+goVersion[1]+" AS build") {
		t.Errorf("the Dockerfile's build stage is not golang:%v (go.mod's go)", goVersion)
	}
	if !strings.Contains(docker, "COPY examples/kubernetes/Caddyfile /etc/caddy/Caddyfile") {
		t.Error("the Dockerfile does not ship examples/kubernetes/Caddyfile as /etc/caddy/Caddyfile")
	}
	cmd := regexp.MustCompile(`(?m)^CMD (\[.*\])$`).FindStringSubmatch(docker)
	var args []string
	if cmd == nil || yaml.Unmarshal([]byte(cmd[1]), &args) != nil {
		t.Fatalf("no CMD [...] in the Dockerfile")
	}
	caddy := find[*appsv1.Deployment](t, loadManifests(t), "kvroute").Spec.Template.Spec.Containers[0]
	if !slices.Equal(args, caddy.Args) {
		t.Errorf("Deployment kvroute runs %v, the image %v", caddy.Args, args)
	}
	mounted := slices.ContainsFunc(caddy.VolumeMounts, func(v corev1.VolumeMount) bool { return v.MountPath == "/etc/caddy" })
	if !mounted || !slices.Contains(args, "/etc/caddy/Caddyfile") {
		t.Error("Deployment kvroute does not run the Caddyfile of its ConfigMap, mounted at /etc/caddy")
	}
}

func find[T metav1.Object](t *testing.T, ms []manifest, name string) T {
	t.Helper()
	for _, o := range all[T](ms) {
		if o.GetName() == name {
			return o
		}
	}
	var zero T
	t.Fatalf("no %T named %q in manifests/", zero, name)
	return zero
}

func all[T any](ms []manifest) []T {
	var out []T
	for _, m := range ms {
		if o, ok := m.obj.(T); ok {
			out = append(out, o)
		}
	}
	return out
}

func hasPort(c corev1.Container, port string) bool {
	return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
		return p.Name == port || strconv.Itoa(int(p.ContainerPort)) == port
	})
}

func servicePort(s *corev1.Service, port string) bool {
	return slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return strconv.Itoa(int(p.Port)) == port })
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(bytes.ReplaceAll(b, []byte("\r\n"), []byte("\n")))
}

func firstDiffLine(a, b string) int {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return i + 1
		}
	}
	return min(len(la), len(lb)) + 1
}
