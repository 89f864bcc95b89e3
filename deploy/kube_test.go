package deploy_test

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/spillway-dev/spillway/internal/config"
	kafkaqueue "github.com/spillway-dev/spillway/internal/failover/kafka"
	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// kobj is one decoded manifest object.
type kobj struct {
	file, gvk, name string
	obj             any
}

// newTyped returns the typed object a manifest of apiVersion/kind decodes
// into. Secrets are refused: they are created by the operator, never
// committed (docs/DEPLOY.md).
func newTyped(gvk string) (any, error) {
	switch gvk {
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1/Service":
		return &corev1.Service{}, nil
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, nil
	case "autoscaling/v2/HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, nil
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "keda.sh/v1alpha1/ScaledObject":
		return &scaledObject{}, nil
	case "keda.sh/v1alpha1/TriggerAuthentication":
		return &triggerAuthentication{}, nil
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &serviceMonitor{}, nil
	case "v1/Secret":
		return nil, fmt.Errorf("a Secret is committed: Secrets are created by the operator (docs/DEPLOY.md)")
	}
	return nil, fmt.Errorf("unknown apiVersion/kind %s", gvk)
}

// decodeManifests decodes every document of a manifest file strictly into
// its typed object: an unknown or misplaced field is an error.
func decodeManifests(file string, b []byte) ([]kobj, error) {
	var out []kobj
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := sigsyaml.Unmarshal([]byte(doc), &tm); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", file, i+1, err)
		}
		gvk := tm.APIVersion + "/" + tm.Kind
		obj, err := newTyped(gvk)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", file, i+1, err)
		}
		if err := strictDecode([]byte(doc), obj); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", file, gvk, err)
		}
		name := objectMeta(obj).Name
		if name == "" {
			return nil, fmt.Errorf("%s: %s without metadata.name", file, gvk)
		}
		out = append(out, kobj{file: file, gvk: gvk, name: name, obj: obj})
	}
	return out, nil
}

// strictDecode decodes YAML into obj the way the API server does in
// strict mode: duplicate keys, unknown fields and fields spelt with another
// case are errors (encoding/json alone would match "coolDownPeriod" to
// cooldownPeriod).
func strictDecode(doc []byte, obj any) error {
	j, err := sigsyaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

func objectMeta(obj any) *metav1.ObjectMeta {
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		return &o.ObjectMeta
	case *corev1.Service:
		return &o.ObjectMeta
	case *appsv1.Deployment:
		return &o.ObjectMeta
	case *autoscalingv2.HorizontalPodAutoscaler:
		return &o.ObjectMeta
	case *policyv1.PodDisruptionBudget:
		return &o.ObjectMeta
	case *scaledObject:
		return &o.ObjectMeta
	case *triggerAuthentication:
		return &o.ObjectMeta
	case *serviceMonitor:
		return &o.ObjectMeta
	}
	panic(fmt.Sprintf("objectMeta: %T", obj))
}

// render builds a kustomization the way kustomize would for what these
// manifests use: resources (files and directories), strategic-merge
// patches of ConfigMap data, a namespace. Anything else is refused, so a
// new kind of patch cannot slip past unchecked. Every YAML file in the
// directory must be listed.
func render(fsys fs.FS, dir string) ([]kobj, error) {
	kf := path.Join(dir, "kustomization.yaml")
	b, err := fs.ReadFile(fsys, kf)
	if err != nil {
		return nil, err
	}
	var k kustomization
	if err := strictDecode(b, &k); err != nil {
		return nil, fmt.Errorf("%s: %w", kf, err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		return nil, fmt.Errorf("%s: apiVersion/kind %s/%s", kf, k.APIVersion, k.Kind)
	}
	listed := map[string]bool{}
	var objs []kobj
	for _, r := range k.Resources {
		p := path.Join(dir, r)
		st, err := fs.Stat(fsys, p)
		if err != nil {
			return nil, fmt.Errorf("%s: resource %s does not exist", kf, r)
		}
		if st.IsDir() {
			sub, err := render(fsys, p)
			if err != nil {
				return nil, err
			}
			objs = append(objs, sub...)
			continue
		}
		listed[p] = true
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return nil, err
		}
		o, err := decodeManifests(p, b)
		if err != nil {
			return nil, err
		}
		objs = append(objs, o...)
	}
	seen := map[string]string{}
	for _, o := range objs {
		id := o.gvk + " " + o.name
		if prev, dup := seen[id]; dup {
			return nil, fmt.Errorf("%s: %s defined in %s and %s", kf, id, prev, o.file)
		}
		seen[id] = o.file
	}
	for _, pt := range k.Patches {
		p := path.Join(dir, pt.Path)
		listed[p] = true
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return nil, fmt.Errorf("%s: patch %s does not exist", kf, pt.Path)
		}
		patches, err := decodeManifests(p, b)
		if err != nil {
			return nil, err
		}
		for _, patch := range patches {
			if err := applyPatch(objs, patch); err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
		}
	}
	files, _ := fs.Glob(fsys, path.Join(dir, "*.yaml"))
	for _, f := range files {
		if f != kf && !listed[f] {
			return nil, fmt.Errorf("%s: %s is in the directory but not listed in resources or patches", kf, path.Base(f))
		}
	}
	for _, o := range objs {
		if k.Namespace != "" {
			objectMeta(o.obj).Namespace = k.Namespace
		}
	}
	return objs, nil
}

func applyPatch(objs []kobj, patch kobj) error {
	for _, o := range objs {
		if o.gvk != patch.gvk || o.name != patch.name {
			continue
		}
		cm, ok := o.obj.(*corev1.ConfigMap)
		if !ok {
			return fmt.Errorf("patches of %s are not rendered by this check: extend render", patch.gvk)
		}
		for k, v := range patch.obj.(*corev1.ConfigMap).Data {
			if cm.Data == nil {
				cm.Data = map[string]string{}
			}
			cm.Data[k] = v
		}
		return nil
	}
	return fmt.Errorf("patch target %s %s does not exist", patch.gvk, patch.name)
}

var secretCmdRe = regexp.MustCompile(`kubectl(?: -n \S+)? create secret generic ([a-z0-9-]+)((?:[^\n]*\\\n)*[^\n]*)`)

// documentedSecrets reads, from docs/DEPLOY.md, the Secrets the operator is
// told to create (`kubectl create secret generic NAME --from-literal=KEY=…`)
// and their keys.
func documentedSecrets(fsys fs.FS) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	b, err := fs.ReadFile(fsys, "docs/DEPLOY.md")
	if err != nil {
		return out
	}
	for _, m := range secretCmdRe.FindAllStringSubmatch(string(b), -1) {
		keys := map[string]bool{}
		for _, k := range regexp.MustCompile(`--from-literal=([A-Za-z0-9_.-]+)=`).FindAllStringSubmatch(m[2], -1) {
			keys[k[1]] = true
		}
		out[m[1]] = keys
	}
	return out
}

// placeholders stand in for Secret values when a Deployment's settings are
// validated; they are shaped like real ones.
var placeholders = map[string]string{"REDIS_URL": "redis://redis.example:6379/0"}

// deployment is a Deployment with what the checks derive from it.
type deployment struct {
	d       *appsv1.Deployment
	process string
	cfg     *config.Config
}

// checkObjects cross-checks one rendered set of manifests. scaled says the
// set must autoscale the consumer with KEDA (the overlays).
func checkObjects(fsys fs.FS, label string, objs []kobj, scaled bool) error {
	var e errs
	deps := map[string]*deployment{}
	cms := map[string]*corev1.ConfigMap{}
	var svcs []*corev1.Service
	var hpas []*autoscalingv2.HorizontalPodAutoscaler
	var pdbs []*policyv1.PodDisruptionBudget
	var sos []*scaledObject
	var sms []*serviceMonitor
	tas := map[string]*triggerAuthentication{}
	for _, o := range objs {
		switch x := o.obj.(type) {
		case *appsv1.Deployment:
			deps[x.Name] = &deployment{d: x}
		case *corev1.ConfigMap:
			cms[x.Name] = x
		case *corev1.Service:
			svcs = append(svcs, x)
		case *autoscalingv2.HorizontalPodAutoscaler:
			hpas = append(hpas, x)
		case *policyv1.PodDisruptionBudget:
			pdbs = append(pdbs, x)
		case *scaledObject:
			sos = append(sos, x)
		case *serviceMonitor:
			sms = append(sms, x)
		case *triggerAuthentication:
			tas[x.Name] = x
		}
	}
	secrets := documentedSecrets(fsys)
	checkedCM := map[string]bool{}
	for _, name := range sortedKeys(deps) {
		checkDeployment(&e, fsys, label, deps[name], cms, secrets, checkedCM, svcs)
	}

	selects := func(sel map[string]string, d *appsv1.Deployment) bool {
		return len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(d.Spec.Template.Labels))
	}
	for _, s := range svcs {
		w := fmt.Sprintf("%s: Service %s", label, s.Name)
		var matched []*deployment
		for _, name := range sortedKeys(deps) {
			if selects(s.Spec.Selector, deps[name].d) {
				matched = append(matched, deps[name])
			}
		}
		if len(matched) != 1 {
			e.add("%s: selector %v matches %d Deployments' pods, want 1", w, s.Spec.Selector, len(matched))
			continue
		}
		c := matched[0].d.Spec.Template.Spec.Containers
		for _, p := range s.Spec.Ports {
			if !containerHasPort(c, p.TargetPort) {
				e.add("%s: port %s targets %s, which no container of %s declares", w, p.Name, p.TargetPort.String(), matched[0].d.Name)
			}
		}
	}
	for _, p := range pdbs {
		w := fmt.Sprintf("%s: PodDisruptionBudget %s", label, p.Name)
		if p.Spec.MaxUnavailable == nil && p.Spec.MinAvailable == nil {
			e.add("%s: sets neither maxUnavailable nor minAvailable", w)
		}
		if n := matchingDeployments(p.Spec.Selector, deps); n != 1 {
			e.add("%s: selector matches %d Deployments' pods, want 1", w, n)
		}
	}
	for _, name := range sortedKeys(deps) {
		n := 0
		for _, p := range pdbs {
			if sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector); err == nil && !sel.Empty() && sel.Matches(labels.Set(deps[name].d.Spec.Template.Labels)) {
				n++
			}
		}
		if n != 1 {
			e.add("%s: Deployment %s is covered by %d PodDisruptionBudgets, want 1", label, name, n)
		}
	}
	for _, sm := range sms {
		w := fmt.Sprintf("%s: ServiceMonitor %s", label, sm.Name)
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil || sel.Empty() {
			e.add("%s: bad or empty selector", w)
			continue
		}
		var matched []*corev1.Service
		for _, s := range svcs {
			if sel.Matches(labels.Set(s.Labels)) {
				matched = append(matched, s)
			}
		}
		if len(matched) == 0 {
			e.add("%s: selector matches no Service's labels", w)
		}
		if len(sm.Spec.Endpoints) == 0 {
			e.add("%s: no endpoints", w)
		}
		for _, ep := range sm.Spec.Endpoints {
			if ep.Path != "" && ep.Path != "/metrics" {
				e.add("%s: path %s, Spillway serves /metrics", w, ep.Path)
			}
			for _, s := range matched {
				found := false
				for _, p := range s.Spec.Ports {
					found = found || p.Name == ep.Port
				}
				if !found {
					e.add("%s: endpoint port %q is no named port of Service %s", w, ep.Port, s.Name)
				}
			}
		}
	}
	scaledBy := map[string][]string{}
	for _, h := range hpas {
		w := fmt.Sprintf("%s: HorizontalPodAutoscaler %s", label, h.Name)
		t := h.Spec.ScaleTargetRef
		d, ok := deps[t.Name]
		if t.Kind != "Deployment" || t.APIVersion != "apps/v1" || !ok {
			e.add("%s: targets %s %s %s, which is no Deployment here", w, t.APIVersion, t.Kind, t.Name)
			continue
		}
		scaledBy[t.Name] = append(scaledBy[t.Name], "HPA "+h.Name)
		if d.process != "api" {
			e.add("%s: scales %s, which runs %q; the HPA is for the api (KEDA scales consumers)", w, t.Name, d.process)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 1 || *h.Spec.MinReplicas > h.Spec.MaxReplicas {
			e.add("%s: minReplicas must be set, at least 1 and at most maxReplicas", w)
		}
		if len(h.Spec.Metrics) == 0 {
			e.add("%s: no metrics", w)
		}
		for _, m := range h.Spec.Metrics {
			if m.Type != autoscalingv2.PodsMetricSourceType || m.Pods == nil {
				e.add("%s: metric of type %s; the api scales on open streams per pod (Pods)", w, m.Type)
				continue
			}
			if !implementedMetrics[m.Pods.Metric.Name] {
				e.add("%s: Pods metric %s is not a Spillway metric", w, m.Pods.Metric.Name)
			}
			if m.Pods.Target.Type != autoscalingv2.AverageValueMetricType || m.Pods.Target.AverageValue == nil || m.Pods.Target.AverageValue.Sign() <= 0 {
				e.add("%s: Pods metric %s needs a positive AverageValue target", w, m.Pods.Metric.Name)
			}
		}
	}
	for _, so := range sos {
		checkScaledObject(&e, label, so, deps, tas)
		scaledBy[so.Spec.ScaleTargetRef.Name] = append(scaledBy[so.Spec.ScaleTargetRef.Name], "ScaledObject "+so.Name)
	}
	for name, by := range scaledBy {
		if len(by) > 1 {
			e.add("%s: Deployment %s is scaled by %v: two autoscalers fight", label, name, by)
		}
	}
	for _, name := range sortedKeys(deps) {
		d := deps[name]
		by := scaledBy[name]
		switch {
		case d.process == "api" && (len(by) != 1 || !strings.HasPrefix(by[0], "HPA")):
			e.add("%s: the api Deployment %s is not scaled by an HPA", label, name)
		case d.process == "consumer" && scaled && (len(by) != 1 || !strings.HasPrefix(by[0], "ScaledObject")):
			e.add("%s: the consumer Deployment %s is not scaled by a KEDA ScaledObject", label, name)
		}
	}
	for _, ta := range tas {
		for _, r := range ta.Spec.SecretTargetRef {
			if !secrets[r.Name][r.Key] {
				e.add("%s: TriggerAuthentication %s reads Secret %s key %s, which docs/DEPLOY.md does not tell the operator to create", label, ta.Name, r.Name, r.Key)
			}
		}
	}
	return e.err()
}

func matchingDeployments(ls *metav1.LabelSelector, deps map[string]*deployment) int {
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil || sel.Empty() {
		return 0
	}
	n := 0
	for _, d := range deps {
		if sel.Matches(labels.Set(d.d.Spec.Template.Labels)) {
			n++
		}
	}
	return n
}

// checkNonRoot reports a runAsNonRoot the kubelet cannot verify: it needs
// runAsUser or a numeric USER in the image, else the pod never starts.
func checkNonRoot(e *errs, fsys fs.FS, w string, sc *corev1.PodSecurityContext) {
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser != nil {
		return
	}
	b, err := fs.ReadFile(fsys, "Dockerfile")
	if err != nil {
		e.add("%s: runAsNonRoot without runAsUser, and no Dockerfile to read the image's user from", w)
		return
	}
	users := regexp.MustCompile(`(?m)^USER\s+(\S+)`).FindAllStringSubmatch(string(b), -1)
	if len(users) == 0 {
		e.add("%s: runAsNonRoot, but the image runs as root (no USER in the Dockerfile)", w)
		return
	}
	uid, _, _ := strings.Cut(users[len(users)-1][1], ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		e.add("%s: runAsNonRoot needs runAsUser or a numeric non-zero USER in the Dockerfile, has %q", w, uid)
	}
}

func containerHasPort(cs []corev1.Container, p intstr.IntOrString) bool {
	for _, c := range cs {
		for _, cp := range c.Ports {
			if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
				return true
			}
		}
	}
	return false
}

// checkDeployment checks one Deployment: selector, container, probes,
// settings (names and Spillway's own validation), Secrets, resources,
// GOMEMLIMIT, and the drain alignment of the grace period and preStop.
func checkDeployment(e *errs, fsys fs.FS, label string, dp *deployment, cms map[string]*corev1.ConfigMap,
	secrets map[string]map[string]bool, checkedCM map[string]bool, svcs []*corev1.Service) {
	d := dp.d
	w := fmt.Sprintf("%s: Deployment %s", label, d.Name)
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		e.add("%s: selector %v does not match its pod labels %v", w, d.Spec.Selector, d.Spec.Template.Labels)
	}
	cs := d.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		e.add("%s: want one container, has %d", w, len(cs))
		return
	}
	c := cs[0]
	if len(c.Command) == 0 || servedPaths[c.Command[0]] == nil {
		e.add("%s: container %s runs %v, want api or consumer", w, c.Name, c.Command)
		return
	}
	dp.process = c.Command[0]
	checkNonRoot(e, fsys, w, d.Spec.Template.Spec.SecurityContext)
	cw := w + " container " + c.Name
	portNames := map[string]bool{}
	for _, p := range c.Ports {
		if p.Name != "" && portNames[p.Name] {
			e.add("%s: port name %s twice", cw, p.Name)
		}
		portNames[p.Name] = true
	}
	for kind, pr := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
		if pr == nil || pr.HTTPGet == nil {
			e.add("%s: needs an HTTP %s", cw, kind)
			continue
		}
		checkProbePath(e, fsys, cw+" "+kind, dp.process, pr.HTTPGet.Path)
		if !containerHasPort(cs, pr.HTTPGet.Port) {
			e.add("%s: %s uses port %s, which the container does not declare", cw, kind, pr.HTTPGet.Port.String())
		}
	}
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil {
			e.add("%s: envFrom other than a ConfigMap", cw)
			continue
		}
		cm, ok := cms[ef.ConfigMapRef.Name]
		if !ok {
			e.add("%s: envFrom ConfigMap %s does not exist", cw, ef.ConfigMapRef.Name)
			continue
		}
		for _, k := range sortedKeys(cm.Data) {
			if !checkedCM[cm.Name] {
				checkEnvName(e, label+": ConfigMap "+cm.Name, k)
			}
			env[k] = cm.Data[k]
		}
		checkedCM[cm.Name] = true
	}
	hasGOMEMLIMIT := false
	for _, ev := range c.Env {
		checkEnvName(e, cw, ev.Name)
		env[ev.Name] = ev.Value
		vf := ev.ValueFrom
		switch {
		case vf == nil:
		case vf.SecretKeyRef != nil:
			r := vf.SecretKeyRef
			if !secrets[r.Name][r.Key] {
				e.add("%s: %s reads Secret %s key %s, which docs/DEPLOY.md does not tell the operator to create", cw, ev.Name, r.Name, r.Key)
			}
			env[ev.Name] = placeholders[ev.Name]
			if env[ev.Name] == "" {
				env[ev.Name] = "placeholder"
			}
		case vf.ConfigMapKeyRef != nil:
			cm, ok := cms[vf.ConfigMapKeyRef.Name]
			if !ok {
				e.add("%s: %s reads ConfigMap %s, which does not exist", cw, ev.Name, vf.ConfigMapKeyRef.Name)
			} else if v, ok := cm.Data[vf.ConfigMapKeyRef.Key]; !ok {
				e.add("%s: %s reads key %s, which ConfigMap %s does not have", cw, ev.Name, vf.ConfigMapKeyRef.Key, cm.Name)
			} else {
				env[ev.Name] = v
			}
		case vf.ResourceFieldRef != nil:
			r := vf.ResourceFieldRef
			if r.ContainerName != c.Name {
				e.add("%s: %s reads a resource of container %q", cw, ev.Name, r.ContainerName)
			}
			if r.Resource == "limits.memory" && c.Resources.Limits.Memory().IsZero() {
				e.add("%s: %s reads limits.memory, which is not set", cw, ev.Name)
			}
			if ev.Name == "GOMEMLIMIT" && r.Resource == "limits.memory" && (r.Divisor.IsZero() || r.Divisor.Value() == 1) {
				hasGOMEMLIMIT = true
			}
			delete(env, ev.Name)
		default:
			e.add("%s: %s has an unsupported valueFrom", cw, ev.Name)
		}
	}
	if !hasGOMEMLIMIT {
		e.add("%s: GOMEMLIMIT must come from the container's limits.memory (in bytes)", cw)
	}
	for _, r := range []string{"cpu", "memory"} {
		if _, ok := c.Resources.Requests[corev1.ResourceName(r)]; !ok {
			e.add("%s: no %s request", cw, r)
		}
	}
	if c.Resources.Limits.Memory().IsZero() {
		e.add("%s: no memory limit", cw)
	} else if req, ok := c.Resources.Requests[corev1.ResourceMemory]; ok && req.Cmp(*c.Resources.Limits.Memory()) > 0 {
		e.add("%s: memory request above the limit", cw)
	}
	for _, k := range sortedKeys(env) {
		if env[k] == "" {
			delete(env, k)
		}
	}
	cfg, err := loadConfig(env)
	if err != nil {
		e.add("%s: its settings do not pass Spillway's validation: %v", cw, err)
		return
	}
	dp.cfg = cfg

	// Drain alignment: preStop (while endpoints go away), then SIGTERM,
	// SHUTDOWN_GRACE_SECONDS of draining and up to 10s of closing, all
	// inside terminationGracePeriodSeconds.
	var preStop int64
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		if c.Lifecycle.PreStop.Sleep == nil {
			e.add("%s: preStop other than a sleep (the image has no shell)", cw)
		} else {
			preStop = c.Lifecycle.PreStop.Sleep.Seconds
		}
	}
	for _, s := range svcs {
		if s.Spec.ClusterIP != corev1.ClusterIPNone && len(s.Spec.Selector) > 0 &&
			labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) && preStop < 5 {
			e.add("%s: Service %s sends it traffic, so it needs a preStop sleep of at least 5s before SIGTERM (endpoints are removed asynchronously)", cw, s.Name)
		}
	}
	tgps := int64(30)
	if d.Spec.Template.Spec.TerminationGracePeriodSeconds != nil {
		tgps = *d.Spec.Template.Spec.TerminationGracePeriodSeconds
	}
	if need := preStop + int64(cfg.ShutdownGrace/time.Second) + 10; tgps < need {
		e.add("%s: terminationGracePeriodSeconds %d < preStop %ds + SHUTDOWN_GRACE_SECONDS %ds + 10s to close: streams would be killed mid-drain",
			w, tgps, preStop, int64(cfg.ShutdownGrace/time.Second))
	}
}

// checkScaledObject checks a KEDA ScaledObject against its CRD's trigger
// rules and against the consumer it scales.
func checkScaledObject(e *errs, label string, so *scaledObject, deps map[string]*deployment,
	tas map[string]*triggerAuthentication) {
	w := fmt.Sprintf("%s: ScaledObject %s", label, so.Name)
	t := so.Spec.ScaleTargetRef
	d, ok := deps[t.Name]
	if !ok || (t.Kind != "" && t.Kind != "Deployment") || (t.APIVersion != "" && t.APIVersion != "apps/v1") {
		e.add("%s: targets %s %s, which is no Deployment here", w, t.Kind, t.Name)
		return
	}
	if d.process != "consumer" {
		e.add("%s: scales %s, which runs %q, not the consumer", w, t.Name, d.process)
	}
	if so.Spec.MaxReplicaCount == nil || so.Spec.MinReplicaCount == nil || *so.Spec.MinReplicaCount > *so.Spec.MaxReplicaCount {
		e.add("%s: minReplicaCount and maxReplicaCount must be set, min ≤ max", w)
		return
	}
	if len(so.Spec.Triggers) == 0 {
		e.add("%s: no triggers", w)
	}
	cfg := d.cfg
	if cfg == nil {
		return
	}
	max := int(*so.Spec.MaxReplicaCount)
	if limit := ceilDiv(cfg.ConnectionPoolSize, cfg.WorkerConcurrency); max > limit {
		e.add("%s: maxReplicaCount %d exceeds CONNECTION_POOL_SIZE/WORKER_CONCURRENCY (%d/%d): the extra consumers would only wait for pool slots",
			w, max, cfg.ConnectionPoolSize, cfg.WorkerConcurrency)
	}
	streamTriggers := map[string]bool{}
	defer func() {
		if len(streamTriggers) == 0 {
			return
		}
		for _, p := range protocol.Priorities {
			if l := redisstream.PriorityStreamKey(cfg.QueuePrefix, p); !streamTriggers[l] {
				e.add("%s: no redis-streams trigger on %s, the %s line: its busy slots would not count", w, l, p)
			}
		}
	}()
	for i, tr := range so.Spec.Triggers {
		tw := fmt.Sprintf("%s: trigger %d (%s)", w, i, tr.Type)
		spec, ok := triggerMetadata[tr.Type]
		if !ok {
			e.add("%s: trigger type %q is not one Spillway's queues can be scaled by (redis-streams, kafka)", tw, tr.Type)
			continue
		}
		known := map[string]bool{}
		for _, k := range append(append([]string{}, spec.required...), spec.optional...) {
			known[k] = true
		}
		for _, k := range spec.required {
			if tr.Metadata[k] == "" {
				e.add("%s: metadata %s is required", tw, k)
			}
		}
		for _, k := range sortedKeys(tr.Metadata) {
			if !known[k] {
				e.add("%s: unknown metadata key %q", tw, k)
			}
		}
		if tr.AuthenticationRef != nil {
			ta, ok := tas[tr.AuthenticationRef.Name]
			if !ok || (tr.AuthenticationRef.Kind != "" && tr.AuthenticationRef.Kind != "TriggerAuthentication") {
				e.add("%s: authenticationRef %s is no TriggerAuthentication here", tw, tr.AuthenticationRef.Name)
			} else {
				for _, r := range ta.Spec.SecretTargetRef {
					okParam := false
					for _, p := range spec.authParams {
						okParam = okParam || p == r.Parameter
					}
					if !okParam {
						e.add("%s: TriggerAuthentication %s supplies %q, which the %s scaler does not take", tw, ta.Name, r.Parameter, tr.Type)
					}
				}
			}
		}
		positive := func(k string) bool {
			n, err := strconv.Atoi(tr.Metadata[k])
			return err == nil && n > 0
		}
		switch tr.Type {
		case "redis-streams":
			if cfg.QueueType != config.QueueTypeRedis {
				e.add("%s: the consumer's QUEUE_TYPE is %s", tw, cfg.QueueType)
			}
			// One trigger per priority's line (docs/QUEUE.md, "Priority
			// order"): pending entries of every line are busy slots.
			var lines []string
			for _, p := range protocol.Priorities {
				lines = append(lines, redisstream.PriorityStreamKey(cfg.QueuePrefix, p))
			}
			if !slices.Contains(lines, tr.Metadata["stream"]) {
				e.add("%s: stream %q, the consumer reads %q", tw, tr.Metadata["stream"], lines)
			}
			streamTriggers[tr.Metadata["stream"]] = true
			if tr.Metadata["consumerGroup"] != redisstream.DefaultGroup {
				e.add("%s: consumerGroup %q, the consumer's group is %q", tw, tr.Metadata["consumerGroup"], redisstream.DefaultGroup)
			}
			n := 0
			for _, k := range []string{"pendingEntriesCount", "streamLength", "lagCount"} {
				if tr.Metadata[k] != "" {
					n++
					if !positive(k) {
						e.add("%s: %s must be a positive integer", tw, k)
					}
				}
			}
			if n != 1 {
				e.add("%s: set exactly one of pendingEntriesCount, streamLength, lagCount", tw)
			}
			if positive("pendingEntriesCount") {
				if v, _ := strconv.Atoi(tr.Metadata["pendingEntriesCount"]); v > cfg.WorkerConcurrency {
					e.add("%s: pendingEntriesCount %d above WORKER_CONCURRENCY %d: pending entries are busy worker slots, so it would never scale up", tw, v, cfg.WorkerConcurrency)
				}
			}
			if tr.Metadata["address"] == "" && tr.Metadata["addressFromEnv"] == "" && tr.Metadata["host"] == "" && tr.Metadata["hostFromEnv"] == "" {
				e.add("%s: no Redis address", tw)
			}
		case "kafka":
			if cfg.QueueType != config.QueueTypeKafka {
				e.add("%s: the consumer's QUEUE_TYPE is %s", tw, cfg.QueueType)
			}
			if got, want := splitList(tr.Metadata["bootstrapServers"]), cfg.KafkaBrokers; strings.Join(got, ",") != strings.Join(sortedCopy(want), ",") {
				e.add("%s: bootstrapServers %v, the consumer's KAFKA_BROKERS are %v", tw, got, want)
			}
			if tr.Metadata["topic"] != kafkaqueue.DefaultTopic {
				e.add("%s: topic %q, the consumer reads %q", tw, tr.Metadata["topic"], kafkaqueue.DefaultTopic)
			}
			if tr.Metadata["consumerGroup"] != kafkaqueue.DefaultGroup {
				e.add("%s: consumerGroup %q, the consumer's group is %q", tw, tr.Metadata["consumerGroup"], kafkaqueue.DefaultGroup)
			}
			if !positive("lagThreshold") {
				e.add("%s: lagThreshold must be a positive integer", tw)
			}
			if max > cfg.KafkaPartitions {
				e.add("%s: maxReplicaCount %d above KAFKA_PARTITIONS %d: consumers without a partition idle", tw, max, cfg.KafkaPartitions)
			}
		}
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}
