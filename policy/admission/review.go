package admission

import (
	"errors"
	"fmt"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/internal/rawjson"
)

// reviewAPIVersion is the only AdmissionReview version the webhook speaks;
// the configurations it ships ask for it.
const reviewAPIVersion = "admission.k8s.io/v1"

// review is the part of an AdmissionReview that evaluation needs, read
// straight from the request bytes. Objects stay raw.
type review struct {
	uid string
	req policy.Request
}

var errNoRequest = errors.New("AdmissionReview has no request")

// decodeReview reads an admission.k8s.io/v1 AdmissionReview without
// decoding object, oldObject or options.
func decodeReview(body []byte) (review, error) {
	var rv review
	var request []byte
	var apiVersion, kind string
	var err error
	walkErr := rawjson.ObjectEach(body, func(k, v []byte) bool {
		switch {
		case rawjson.KeyIs(k, "request"):
			request = v
		case rawjson.KeyIs(k, "apiVersion"):
			apiVersion, err = rawjson.String(v)
		case rawjson.KeyIs(k, "kind"):
			kind, err = rawjson.String(v)
		}
		return err == nil
	})
	if walkErr != nil {
		return rv, fmt.Errorf("decode AdmissionReview: %w", walkErr)
	}
	if err != nil {
		return rv, fmt.Errorf("decode AdmissionReview: %w", err)
	}
	if kind != "AdmissionReview" || apiVersion != reviewAPIVersion {
		return rv, fmt.Errorf("decode AdmissionReview: got kind %q apiVersion %q, want AdmissionReview %s", kind, apiVersion, reviewAPIVersion)
	}
	if rawjson.Kind(request) != '{' {
		return rv, errNoRequest
	}
	if err := decodeRequest(request, &rv); err != nil {
		return rv, fmt.Errorf("decode AdmissionReview request: %w", err)
	}
	if rv.uid == "" {
		return rv, fmt.Errorf("decode AdmissionReview request: uid is empty")
	}
	return rv, nil
}

func decodeRequest(request []byte, rv *review) error {
	r := &rv.req
	var err error
	walkErr := rawjson.ObjectEach(request, func(k, v []byte) bool {
		key := k[1 : len(k)-1] // member names of AdmissionRequest carry no escapes
		switch string(key) {
		case "uid":
			rv.uid, err = rawjson.String(v)
		case "resource":
			err = decodeResource(v, r)
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
			err = decodeUserInfo(v, &r.User)
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
			err = fmt.Errorf("%s: %w", key, err)
		}
		return err == nil
	})
	if walkErr != nil {
		return walkErr
	}
	return err
}

func nullToNil(v []byte) []byte {
	if rawjson.IsNull(v) {
		return nil
	}
	return v
}

func decodeResource(v []byte, r *policy.Request) error {
	if rawjson.IsNull(v) {
		return nil
	}
	var err error
	walkErr := rawjson.ObjectEach(v, func(k, v []byte) bool {
		switch {
		case rawjson.KeyIs(k, "group"):
			r.Group, err = rawjson.String(v)
		case rawjson.KeyIs(k, "resource"):
			r.Resource, err = rawjson.String(v)
		}
		return err == nil
	})
	if walkErr != nil {
		return walkErr
	}
	return err
}

func decodeUserInfo(v []byte, u *policy.UserInfo) error {
	if rawjson.IsNull(v) {
		return nil
	}
	var err error
	walkErr := rawjson.ObjectEach(v, func(k, v []byte) bool {
		switch {
		case rawjson.KeyIs(k, "username"):
			u.Name, err = rawjson.String(v)
		case rawjson.KeyIs(k, "groups"):
			u.Groups, err = rawjson.Strings(v)
		}
		return err == nil
	})
	if walkErr != nil {
		return walkErr
	}
	return err
}
