package deploy_test

import (
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The custom resources below are not in k8s.io/api; these structs carry
// the fields of their CRDs (KEDA v2 keda.sh/v1alpha1, Prometheus Operator
// monitoring.coreos.com/v1, kustomize's Kustomization) that a manifest may
// use here, so strict decoding refuses a misspelt or misplaced field as the
// API server's schema validation would.

// scaledObject is KEDA's ScaledObject (keda.sh/v1alpha1).
type scaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              scaledObjectSpec `json:"spec"`
}

type scaledObjectSpec struct {
	ScaleTargetRef struct {
		APIVersion             string `json:"apiVersion,omitempty"`
		Kind                   string `json:"kind,omitempty"`
		Name                   string `json:"name"`
		EnvSourceContainerName string `json:"envSourceContainerName,omitempty"`
	} `json:"scaleTargetRef"`
	PollingInterval       *int32 `json:"pollingInterval,omitempty"`
	InitialCooldownPeriod *int32 `json:"initialCooldownPeriod,omitempty"`
	CooldownPeriod        *int32 `json:"cooldownPeriod,omitempty"`
	IdleReplicaCount      *int32 `json:"idleReplicaCount,omitempty"`
	MinReplicaCount       *int32 `json:"minReplicaCount,omitempty"`
	MaxReplicaCount       *int32 `json:"maxReplicaCount,omitempty"`
	Advanced              *struct {
		RestoreToOriginalReplicaCount bool `json:"restoreToOriginalReplicaCount,omitempty"`
		HorizontalPodAutoscalerConfig *struct {
			Name     string                                         `json:"name,omitempty"`
			Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
		} `json:"horizontalPodAutoscalerConfig,omitempty"`
	} `json:"advanced,omitempty"`
	Fallback *struct {
		FailureThreshold int32 `json:"failureThreshold"`
		Replicas         int32 `json:"replicas"`
	} `json:"fallback,omitempty"`
	Triggers []scaleTrigger `json:"triggers"`
}

type scaleTrigger struct {
	Type              string            `json:"type"`
	Name              string            `json:"name,omitempty"`
	UseCachedMetrics  bool              `json:"useCachedMetrics,omitempty"`
	MetricType        string            `json:"metricType,omitempty"`
	Metadata          map[string]string `json:"metadata"`
	AuthenticationRef *struct {
		Name string `json:"name"`
		Kind string `json:"kind,omitempty"`
	} `json:"authenticationRef,omitempty"`
}

// triggerAuthentication is KEDA's TriggerAuthentication (keda.sh/v1alpha1).
type triggerAuthentication struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SecretTargetRef []struct {
			Parameter string `json:"parameter"`
			Name      string `json:"name"`
			Key       string `json:"key"`
		} `json:"secretTargetRef,omitempty"`
		Env []struct {
			Parameter     string `json:"parameter"`
			Name          string `json:"name"`
			ContainerName string `json:"containerName,omitempty"`
		} `json:"env,omitempty"`
	} `json:"spec"`
}

// triggerMetadata lists, per KEDA scaler, the metadata keys it requires and
// the ones it accepts; parameters a TriggerAuthentication may supply.
var triggerMetadata = map[string]struct {
	required, optional, authParams []string
}{
	"redis-streams": {
		required: []string{"stream", "consumerGroup"},
		optional: []string{"address", "addressFromEnv", "host", "hostFromEnv", "port", "portFromEnv",
			"usernameFromEnv", "passwordFromEnv", "databaseIndex", "enableTLS", "unsafeSsl",
			"pendingEntriesCount", "streamLength", "lagCount", "activationLagCount", "activationValue"},
		authParams: []string{"username", "password", "tls", "ca", "cert", "key", "keyPassword"},
	},
	"kafka": {
		required: []string{"bootstrapServers", "consumerGroup"},
		optional: []string{"topic", "lagThreshold", "activationLagThreshold", "offsetResetPolicy",
			"allowIdleConsumers", "scaleToZeroOnInvalidOffset", "excludePersistentLag",
			"limitToPartitionsWithLag", "partitionLimitation", "version", "tls", "sasl"},
		authParams: []string{"sasl", "username", "password", "tls", "ca", "cert", "key", "keyPassword"},
	},
}

// serviceMonitor is the Prometheus Operator's ServiceMonitor
// (monitoring.coreos.com/v1).
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		JobLabel          string               `json:"jobLabel,omitempty"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		Endpoints []struct {
			Port          string `json:"port,omitempty"`
			Path          string `json:"path,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
			HonorLabels   bool   `json:"honorLabels,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// kustomization is kustomize's Kustomization
// (kustomize.config.k8s.io/v1beta1), the fields used here.
type kustomization struct {
	metav1.TypeMeta `json:",inline"`
	Namespace       string   `json:"namespace,omitempty"`
	Resources       []string `json:"resources,omitempty"`
	Patches         []struct {
		Path   string `json:"path,omitempty"`
		Target *struct {
			Kind string `json:"kind,omitempty"`
			Name string `json:"name,omitempty"`
		} `json:"target,omitempty"`
	} `json:"patches,omitempty"`
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images,omitempty"`
}
