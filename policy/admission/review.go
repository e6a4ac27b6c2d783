package admission

import (
	"errors"
	"fmt"

	"github.com/stampguard/stampguard/internal/rawjson"
	"github.com/stampguard/stampguard/policy"
)

// reviewAPIVersion is the only AdmissionReview version the webhook speaks;
// the configurations it ships ask for it.
const reviewAPIVersion = "admission.k8s.io/v1"

// review is the part of an AdmissionReview that evaluation needs, read
// straight from the request bytes. Objects stay raw.
type review struct {
	uid string
	req policy.Request
	// kind and kindGroup are request.kind's, which name the object in
	// a refusal's details.
	kind, kindGroup string
}

var errNoRequest = errors.New("AdmissionReview has no request")

// decodeReview reads an admission.k8s.io/v1 AdmissionReview without
// decoding object, oldObject or options.
//
// With a policy set, object and oldObject are scanned for the values of the
// set's rules in the same pass that finds where they end.
func decodeReview(body []byte, set *policy.Set) (review, error) {
	var rv review
	var apiVersion, kind string
	hasRequest := false
	_, err := rawjson.ObjectScan(body, func(k, data []byte, start int) (int, error) {
		if rawjson.KeyIs(k, "request") && rawjson.Kind(data[start:]) == '{' {
			hasRequest = true
			end, err := decodeRequest(data[start:], &rv, set)
			if err != nil {
				return 0, fmt.Errorf("request: %w", err)
			}
			return start + end, nil
		}
		end, err := rawjson.Skip(data, start)
		if err != nil {
			return 0, err
		}
		switch {
		case rawjson.KeyIs(k, "apiVersion"):
			apiVersion, err = rawjson.String(data[start:end])
		case rawjson.KeyIs(k, "kind"):
			kind, err = rawjson.String(data[start:end])
		}
		return end, err
	})
	if err != nil {
		return rv, fmt.Errorf("decode AdmissionReview: %w", err)
	}
	if kind != "AdmissionReview" || apiVersion != reviewAPIVersion {
		return rv, fmt.Errorf("decode AdmissionReview: got kind %q apiVersion %q, want AdmissionReview %s", kind, apiVersion, reviewAPIVersion)
	}
	if !hasRequest {
		return rv, errNoRequest
	}
	if rv.uid == "" {
		return rv, fmt.Errorf("decode AdmissionReview request: uid is empty")
	}
	return rv, nil
}

func decodeRequest(request []byte, rv *review, set *policy.Set) (int, error) {
	r := &rv.req
	return rawjson.ObjectScan(request, func(k, data []byte, start int) (int, error) {
		key := k[1 : len(k)-1] // member names of AdmissionRequest carry no escapes
		if set != nil {
			switch string(key) {
			case "object":
				return set.ScanObject(r, false, data, start)
			case "oldObject":
				return set.ScanObject(r, true, data, start)
			}
		}
		end, err := rawjson.Skip(data, start)
		if err != nil {
			return 0, err
		}
		v := data[start:end]
		switch string(key) {
		case "uid":
			rv.uid, err = rawjson.String(v)
		case "resource":
			err = decodeGroupAnd(v, "resource", &r.Group, &r.Resource)
		case "kind":
			err = decodeGroupAnd(v, "kind", &rv.kindGroup, &rv.kind)
		case "subResource":
			r.SubResource, err = rawjson.String(v)
		case "name":
			r.Name, err = rawjson.String(v)
		case "namespace":
			r.Namespace, err = rawjson.String(v)
		case "operation":
			var op string
			op, err = rawjson.String(v)
			r.Operation = policy.Operation(op)
		case "userInfo":
			r.User, err = policy.DecodeUserInfo(v)
		case "object":
			r.Object = nullToNil(v)
		case "oldObject":
			r.OldObject = nullToNil(v)
		case "options":
			r.Options = nullToNil(v)
		case "dryRun":
			r.DryRun, err = rawjson.Bool(v)
		}
		if err != nil {
			return 0, fmt.Errorf("%s: %w", key, err)
		}
		return end, nil
	})
}

func nullToNil(v []byte) []byte {
	if rawjson.IsNull(v) {
		return nil
	}
	return v
}

// decodeGroupAnd reads request.resource or request.kind: its group, and
// the member named name (resource, kind) into value.
func decodeGroupAnd(v []byte, name string, group, value *string) error {
	if rawjson.IsNull(v) {
		return nil
	}
	var err error
	walkErr := rawjson.ObjectEach(v, func(k, v []byte) bool {
		switch {
		case rawjson.KeyIs(k, "group"):
			*group, err = rawjson.String(v)
		case rawjson.KeyIs(k, name):
			*value, err = rawjson.String(v)
		}
		return err == nil
	})
	if walkErr != nil {
		return walkErr
	}
	return err
}
