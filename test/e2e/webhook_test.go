package e2e

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/stampguard/stampguard/cmd/webhook/app"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/webhookconfig"
)

func TestWebhook(t *testing.T) {
	// The audit levels docs/audit-policy.yaml recommends, at which the
	// log holds what a replay needs (see the replay below).
	env := startWebhookEnvAudited(t, recommendedAuditPolicy(t))
	admin := env.Client
	alice := env.ClientAs(t, "alice")
	// The rule subtests below each guard a namespace of their own with a
	// policy applied before their first write there, and change no policy
	// of another: from here to the end of "warn and audit actions" the
	// policies in force only grow, and each write met the set it would
	// meet at the end.
	replayFrom := time.Now()

	t.Run("stampless updates", func(t *testing.T) {
		ns := "stamp"
		namespace(t, admin, ns, nil)
		applyPolicy(t, admin, &v1alpha1.ConcurrencyPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "configmaps-stamp"},
			Spec: v1alpha1.ConcurrencyPolicySpec{
				Match:                  v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Group: "", Resource: "configmaps"}}, Namespaces: []string{ns}},
				RequireResourceVersion: true,
			},
		}, metav1.ConditionTrue)
		ctx := t.Context()
		cm := configMap(ns, "settings", nil)
		create(t, alice, cm)

		t.Run("a stampless PUT on a guarded kind is refused with 422 and a resourceVersion cause", func(t *testing.T) {
			blind := configMap(ns, "settings", nil)
			blind.Data["k"] = "blind"
			err := alice.Update(ctx, blind)
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want 422 Invalid, got %v", err)
			}
			st := statusOf(t, err)
			for _, want := range []string{`admission webhook "stamp.stampguard.dev" denied the request`, `ConcurrencyPolicy "configmaps-stamp"`, "must be specified for an update"} {
				if !strings.Contains(st.Message, want) {
					t.Errorf("message %q lacks %q", st.Message, want)
				}
			}
			if st.Details == nil || len(st.Details.Causes) != 1 || st.Details.Causes[0].Field != "metadata.resourceVersion" {
				t.Errorf("want one cause on metadata.resourceVersion, got %+v", st.Details)
			}
		})
		t.Run("a stampless dry-run PUT is refused too", func(t *testing.T) {
			blind := configMap(ns, "settings", nil)
			if err := alice.Update(ctx, blind, client.DryRunAll); !apierrors.IsInvalid(err) {
				t.Fatalf("want 422 Invalid, got %v", err)
			}
		})
		t.Run("a stamped PUT passes", func(t *testing.T) {
			var cur corev1.ConfigMap
			if err := alice.Get(ctx, client.ObjectKeyFromObject(cm), &cur); err != nil {
				t.Fatal(err)
			}
			cur.Data["k"] = "stamped"
			if err := alice.Update(ctx, &cur); err != nil {
				t.Fatalf("stamped update refused: %v", err)
			}
		})
		t.Run("a merge PATCH passes", func(t *testing.T) {
			p := client.RawPatch(types.MergePatchType, []byte(`{"data":{"k":"patched"}}`))
			if err := alice.Patch(ctx, configMap(ns, "settings", nil), p); err != nil {
				t.Fatalf("patch refused: %v", err)
			}
		})
		t.Run("a server-side apply passes", func(t *testing.T) {
			p := client.RawPatch(types.ApplyPatchType, []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"settings","namespace":"stamp"},"data":{"applied":"yes"}}`))
			if err := alice.Patch(ctx, configMap(ns, "settings", nil), p, client.FieldOwner("e2e-apply")); err != nil {
				t.Fatalf("apply refused: %v", err)
			}
		})
		t.Run("a PATCH that nulls resourceVersion is refused", func(t *testing.T) {
			p := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"resourceVersion":null},"data":{"k":"nulled"}}`))
			err := alice.Patch(ctx, configMap(ns, "settings", nil), p)
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want 422 Invalid, got %v", err)
			}
		})
		t.Run("an unguarded kind is untouched", func(t *testing.T) {
			sa := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s"}, StringData: map[string]string{"a": "b"}}
			create(t, alice, sa)
			blind := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s"}, StringData: map[string]string{"a": "c"}}
			if err := alice.Update(ctx, blind); err != nil {
				t.Fatalf("stampless update of an unguarded secret refused: %v", err)
			}
		})
		t.Run("stamped writes never reach the webhook", func(t *testing.T) {
			before := counterValue(t, env.registry, "stampguard_admission_requests_total", "stamp")
			for i := range 5 {
				var cur corev1.ConfigMap
				if err := alice.Get(ctx, client.ObjectKeyFromObject(cm), &cur); err != nil {
					t.Fatal(err)
				}
				cur.Data["n"] = fmt.Sprint(i)
				if err := alice.Update(ctx, &cur); err != nil {
					t.Fatal(err)
				}
			}
			if after := counterValue(t, env.registry, "stampguard_admission_requests_total", "stamp"); after != before {
				t.Fatalf("stamped updates reached the stamp endpoint: %v -> %v calls", before, after)
			}
			_ = alice.Update(ctx, configMap(ns, "settings", nil))
			if after := counterValue(t, env.registry, "stampguard_admission_requests_total", "stamp"); after <= before {
				t.Fatalf("a stampless update did not reach the stamp endpoint: %v -> %v calls", before, after)
			}
		})
	})

	t.Run("stampless Scale PUTs", func(t *testing.T) {
		ns := "scale"
		namespace(t, admin, ns, nil)
		applyPolicy(t, admin, &v1alpha1.ConcurrencyPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "deployments-stamp"},
			Spec: v1alpha1.ConcurrencyPolicySpec{
				Match:                  v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Group: "apps", Resource: "deployments"}}, Namespaces: []string{ns}},
				RequireResourceVersion: true,
			},
		}, metav1.ConditionTrue)
		ctx := t.Context()
		create(t, admin, deployment(ns, "web", 3))
		cs := kubernetes.NewForConfigOrDie(env.As("alice"))
		t.Run("a stampless PUT to deployments/scale is refused with the same 422", func(t *testing.T) {
			s, err := cs.AppsV1().Deployments(ns).GetScale(ctx, "web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			s.ResourceVersion = "" // an unconditional overwrite of replicas
			s.Spec.Replicas = 9
			_, err = cs.AppsV1().Deployments(ns).UpdateScale(ctx, "web", s, metav1.UpdateOptions{})
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want 422 Invalid, got %v", err)
			}
			st := statusOf(t, err)
			for _, want := range []string{`admission webhook "stamp.stampguard.dev" denied the request`, `ConcurrencyPolicy "deployments-stamp"`, "must be specified for an update"} {
				if !strings.Contains(st.Message, want) {
					t.Errorf("message %q lacks %q", st.Message, want)
				}
			}
			d, err := cs.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if *d.Spec.Replicas != 3 {
				t.Fatalf("replicas became %d", *d.Spec.Replicas)
			}
		})
		t.Run("a stamped PUT to deployments/scale passes", func(t *testing.T) {
			s, err := cs.AppsV1().Deployments(ns).GetScale(ctx, "web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			s.Spec.Replicas = 4
			if _, err := cs.AppsV1().Deployments(ns).UpdateScale(ctx, "web", s, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("stamped scale refused: %v", err)
			}
		})
	})

	t.Run("field owners", func(t *testing.T) {
		ns := "owners"
		namespace(t, admin, ns, nil)
		applyPolicy(t, admin, &v1alpha1.ConcurrencyPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "deployments"},
			Spec: v1alpha1.ConcurrencyPolicySpec{
				Match: v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Group: "apps", Resource: "deployments"}}, Namespaces: []string{ns}},
				FieldOwners: []v1alpha1.FieldOwner{{
					Path:    "spec.replicas",
					Writers: v1alpha1.Writers{ServiceAccounts: []string{"kube-system/horizontal-pod-autoscaler"}},
				}},
			},
		}, metav1.ConditionTrue)
		ctx := t.Context()
		create(t, admin, deployment(ns, "web", 3))
		hpa := kubernetes.NewForConfigOrDie(env.As("system:serviceaccount:kube-system:horizontal-pod-autoscaler", "system:serviceaccounts"))
		aliceCS := kubernetes.NewForConfigOrDie(env.As("alice"))

		t.Run("the HPA identity may change spec.replicas by update", func(t *testing.T) {
			d, err := hpa.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			d.Spec.Replicas = ptr.To[int32](4)
			if _, err := hpa.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("owner refused: %v", err)
			}
		})
		t.Run("the HPA identity may change spec.replicas through /scale", func(t *testing.T) {
			s, err := hpa.AppsV1().Deployments(ns).GetScale(ctx, "web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			s.Spec.Replicas = 3
			if _, err := hpa.AppsV1().Deployments(ns).UpdateScale(ctx, "web", s, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("owner refused through scale: %v", err)
			}
		})
		t.Run("another user may not change spec.replicas, and the answer says who owns it", func(t *testing.T) {
			d, err := aliceCS.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			d.Spec.Replicas = ptr.To[int32](5)
			calls := 0
			err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				calls++
				_, err := aliceCS.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{})
				return err
			})
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want 422 Invalid, got %v", err)
			}
			if calls != 1 {
				t.Fatalf("retry.RetryOnConflict sent the refused update %d times, want once", calls)
			}
			want := `ConcurrencyPolicy "deployments": spec.replicas is owned by system:serviceaccount:kube-system:horizontal-pod-autoscaler; alice may not change it (3 -> 5)`
			st := statusOf(t, err)
			if !strings.Contains(st.Message, `admission webhook "fields.stampguard.dev" denied the request: `+want) {
				t.Fatalf("message %q lacks the webhook and %q", st.Message, want)
			}
			// What kubectl prints for a 422: "The Deployment "web" is
			// invalid: spec.replicas: <message>", from the details.
			if d := st.Details; d == nil || d.Kind != "Deployment" || d.Group != "apps" || d.Name != "web" ||
				len(d.Causes) != 1 || d.Causes[0].Field != "spec.replicas" || d.Causes[0].Type != "FieldValueForbidden" || d.Causes[0].Message != want {
				t.Fatalf("details %+v, want the Deployment named and one FieldValueForbidden cause on spec.replicas", st.Details)
			}
		})
		t.Run("another user may not change spec.replicas through /scale", func(t *testing.T) {
			s, err := aliceCS.AppsV1().Deployments(ns).GetScale(ctx, "web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			s.Spec.Replicas = 7
			_, err = aliceCS.AppsV1().Deployments(ns).UpdateScale(ctx, "web", s, metav1.UpdateOptions{})
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want 422 Invalid through scale, got %v", err)
			}
		})
		t.Run("another user may still change other fields", func(t *testing.T) {
			d, err := aliceCS.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			d.Spec.Template.Annotations = map[string]string{"restartedAt": "now"}
			if _, err := aliceCS.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("unrelated change refused: %v", err)
			}
		})
	})

	t.Run("immutable fields", func(t *testing.T) {
		ns := "immutable"
		namespace(t, admin, ns, nil)
		applyPolicy(t, admin, &v1alpha1.ConcurrencyPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "labels"},
			Spec: v1alpha1.ConcurrencyPolicySpec{
				Match: v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "configmaps"}}, Namespaces: []string{ns}},
				ImmutableFields: []v1alpha1.ImmutableField{
					{Path: `metadata.labels["team"]`, Mode: v1alpha1.ImmutableAlways},
					{Path: `metadata.labels["owner"]`, Mode: v1alpha1.ImmutableOnceSet},
				},
			},
		}, metav1.ConditionTrue)
		create(t, alice, configMap(ns, "app", map[string]string{"team": "a"}))
		relabel := func(set map[string]string, del ...string) error {
			var cur corev1.ConfigMap
			if err := alice.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "app"}, &cur); err != nil {
				t.Fatal(err)
			}
			for k, v := range set {
				cur.Labels[k] = v
			}
			for _, k := range del {
				delete(cur.Labels, k)
			}
			return alice.Update(t.Context(), &cur)
		}
		cases := []struct {
			name    string
			set     map[string]string
			del     []string
			allowed bool
		}{
			{"an Always field may not change", map[string]string{"team": "b"}, nil, false},
			{"an Always field may not be removed", nil, []string{"team"}, false},
			{"a OnceSet field may be set when absent", map[string]string{"owner": "alice"}, nil, true},
			{"a OnceSet field may not change once set", map[string]string{"owner": "bob"}, nil, false},
			{"a OnceSet field may not be removed once set", nil, []string{"owner"}, false},
			{"other labels may change", map[string]string{"free": "yes"}, nil, true},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				err := relabel(c.set, c.del...)
				if c.allowed && err != nil {
					t.Fatalf("refused: %v", err)
				}
				if !c.allowed && !apierrors.IsInvalid(err) {
					t.Fatalf("want 422 Invalid, got %v", err)
				}
			})
		}
	})

	t.Run("delete preconditions", func(t *testing.T) {
		ns := "deletes"
		namespace(t, admin, ns, nil)
		applyPolicy(t, admin, &v1alpha1.ConcurrencyPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "careful-deletes"},
			Spec: v1alpha1.ConcurrencyPolicySpec{
				Match:                      v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "configmaps"}}, Namespaces: []string{ns}},
				RequireDeletePreconditions: v1alpha1.DeletePreconditionUID,
			},
		}, metav1.ConditionTrue)
		ctx := t.Context()
		cm := configMap(ns, "victim", nil)
		create(t, alice, cm)
		t.Run("a delete without a uid precondition is refused", func(t *testing.T) {
			err := alice.Delete(ctx, configMap(ns, "victim", nil))
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "must carry a uid precondition") {
				t.Fatalf("want 422 naming the uid precondition, got %v", err)
			}
		})
		t.Run("a delete with a uid precondition passes", func(t *testing.T) {
			if err := alice.Delete(ctx, cm, client.Preconditions{UID: &cm.UID}); err != nil {
				t.Fatalf("refused: %v", err)
			}
		})
		t.Run("deletecollection is exempt by default", func(t *testing.T) {
			create(t, alice, configMap(ns, "bulk-1", nil))
			create(t, alice, configMap(ns, "bulk-2", nil))
			if err := alice.DeleteAllOf(ctx, &corev1.ConfigMap{}, client.InNamespace(ns)); err != nil {
				t.Fatalf("deletecollection refused: %v", err)
			}
			var left corev1.ConfigMapList
			if err := alice.List(ctx, &left, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			for _, c := range left.Items {
				if strings.HasPrefix(c.Name, "bulk-") {
					t.Errorf("%s survived deletecollection", c.Name)
				}
			}
		})
	})

	t.Run("warn and audit actions", func(t *testing.T) {
		ns := "soft"
		namespace(t, admin, ns, nil)
		applyPolicy(t, admin, &v1alpha1.ConcurrencyPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "soft"},
			Spec: v1alpha1.ConcurrencyPolicySpec{
				Match: v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "configmaps"}}, Namespaces: []string{ns}},
				ImmutableFields: []v1alpha1.ImmutableField{
					{Path: `metadata.labels["warned"]`, Action: v1alpha1.ActionWarn},
					{Path: `metadata.labels["audited"]`, Action: v1alpha1.ActionAudit},
				},
			},
		}, metav1.ConditionTrue)
		w := &warnings{}
		cfg := env.As("alice")
		cfg.WarningHandler = w
		c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		create(t, c, configMap(ns, "cm", map[string]string{"warned": "1", "audited": "1"}))
		update := func(label string) {
			t.Helper()
			var cur corev1.ConfigMap
			if err := c.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "cm"}, &cur); err != nil {
				t.Fatal(err)
			}
			cur.Labels[label] = "2"
			if err := c.Update(t.Context(), &cur); err != nil {
				t.Fatalf("a %s violation was refused: %v", label, err)
			}
		}
		t.Run("Warn allows the write and the client sees a warning", func(t *testing.T) {
			update("warned")
			got := strings.Join(w.all(), "\n")
			if !strings.Contains(got, `ConcurrencyPolicy "soft": metadata.labels["warned"] is immutable; alice may not change it ("1" -> "2")`) {
				t.Fatalf("warnings %q lack the policy's", got)
			}
		})
		t.Run("Audit allows the write and the audit log records the annotation", func(t *testing.T) {
			update("audited")
			eventually(t, 15*time.Second, func() error {
				return auditLogHas(env.AuditLogPath, `"fields.stampguard.dev/immutable-field"`, `\"action\":\"Audit\"`, `\"path\":\"metadata.labels[\\\"audited\\\"]\"`)
			})
		})
	})

	t.Run("a replay of this test's audit log at its policies gives the webhook's decisions", func(t *testing.T) {
		replayEqualsEnforcement(t, env, replayFrom, time.Now())
	})

	t.Run("policies reload live", func(t *testing.T) {
		ns := "reload"
		namespace(t, admin, ns, nil)
		ctx := t.Context()
		create(t, alice, configMap(ns, "cm", nil))
		stampless := func() error { return alice.Update(ctx, configMap(ns, "cm", nil)) }
		if err := stampless(); err != nil {
			t.Fatalf("refused before any policy: %v", err)
		}
		p := &v1alpha1.ConcurrencyPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "reload"},
			Spec: v1alpha1.ConcurrencyPolicySpec{
				Match:                  v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "configmaps"}}, Namespaces: []string{ns}},
				RequireResourceVersion: true,
			},
		}
		t.Run("a created policy takes effect", func(t *testing.T) {
			applyPolicy(t, admin, p, metav1.ConditionTrue)
			if err := stampless(); !apierrors.IsInvalid(err) {
				t.Fatalf("want 422 after create, got %v", err)
			}
		})
		t.Run("a changed policy takes effect", func(t *testing.T) {
			p.Spec.Action = v1alpha1.ActionAudit
			applyPolicy(t, admin, p, metav1.ConditionTrue)
			if err := stampless(); err != nil {
				t.Fatalf("refused after switching to Audit: %v", err)
			}
		})
		t.Run("an invalid policy is refused with a status that names the field", func(t *testing.T) {
			bad := &v1alpha1.ConcurrencyPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "bad-path"},
				Spec: v1alpha1.ConcurrencyPolicySpec{
					Match:           v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "configmaps"}}, Namespaces: []string{ns}},
					ImmutableFields: []v1alpha1.ImmutableField{{Path: "metadata..labels"}},
				},
			}
			got := applyPolicy(t, admin, bad, metav1.ConditionFalse)
			cond := apimeta.FindStatusCondition(got.Status.Conditions, app.ConditionReady)
			if !strings.Contains(cond.Message, "spec.immutableFields[0].path") {
				t.Fatalf("condition message %q does not name the field", cond.Message)
			}
			if err := admin.Delete(ctx, bad); err != nil {
				t.Fatal(err)
			}
		})
		t.Run("a deleted policy stops applying", func(t *testing.T) {
			p.Spec.Action = v1alpha1.ActionDeny
			applyPolicy(t, admin, p, metav1.ConditionTrue)
			if err := stampless(); !apierrors.IsInvalid(err) {
				t.Fatalf("want 422 before delete, got %v", err)
			}
			if err := admin.Delete(ctx, &v1alpha1.ConcurrencyPolicy{ObjectMeta: metav1.ObjectMeta{Name: "reload"}}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 20*time.Second, stampless)
		})
	})

	t.Run("webhook down", func(t *testing.T) {
		// A port nobody listens on.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		deadURL := "https://" + ln.Addr().String()
		_ = ln.Close()
		for _, fp := range []admissionregistrationv1.FailurePolicyType{admissionregistrationv1.Ignore, admissionregistrationv1.Fail} {
			ns := "down-" + strings.ToLower(string(fp))
			namespace(t, admin, ns, map[string]string{"e2e.stampguard.dev/down": string(fp)})
			mut, val := webhookconfig.Configurations(webhookconfig.ConfigOptions{
				Name: "down-" + strings.ToLower(string(fp)), URL: deadURL, CABundle: env.CAData, StampFailurePolicy: fp, FieldsFailurePolicy: fp, RouteAll: true,
				Resources:         []webhookconfig.GuardedResource{{Resource: "configmaps"}},
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"e2e.stampguard.dev/down": string(fp)}},
			})
			create(t, admin, mut)
			create(t, admin, val)
		}
		ctx := t.Context()
		// Fail first: its refusal proves that the apiserver has loaded the
		// Fail configuration, and with it the Ignore one, created before it
		// (the apiserver's informer delivers configurations in order).
		failLive := t.Run("failurePolicy Fail refuses writes with a clear error", func(t *testing.T) {
			eventually(t, 10*time.Second, func() error {
				err := alice.Create(ctx, configMap("down-fail", "cm", nil))
				if err == nil {
					_ = admin.Delete(ctx, configMap("down-fail", "cm", nil))
					return errors.New("create passed")
				}
				if !strings.Contains(err.Error(), `failed calling webhook "fields.stampguard.dev"`) {
					return fmt.Errorf("unclear error: %w", err)
				}
				return nil
			})
		})
		t.Run("failurePolicy Ignore lets writes through, and the apiserver records that it called the webhook and failed open", func(t *testing.T) {
			if !failLive {
				t.Fatal("the configurations were never proven live")
			}
			if err := alice.Create(ctx, configMap("down-ignore", "cm", nil)); err != nil {
				t.Fatalf("refused under failurePolicy Ignore: %v", err)
			}
			// Without this, a create that passed because the configuration was
			// not loaded yet would pass the test too.
			eventually(t, 15*time.Second, func() error {
				return auditLogHas(env.AuditLogPath, `"verb":"create"`, `"namespace":"down-ignore"`,
					`"failed-open.validating.webhook.admission.k8s.io/round_0_index_`, `":"fields.stampguard.dev"`)
			})
		})
	})
}
