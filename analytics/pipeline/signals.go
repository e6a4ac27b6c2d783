package pipeline

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stampguard/stampguard/internal/audit"
)

// OtherLabel is the label value of everything past a label's bound: no
// namespace, resource or Kubernetes user name can be "_other"... except a
// user name chosen to be, which only merges that user with the rest.
const OtherLabel = "_other"

// Defaults of SignalOptions.
const (
	DefaultMaxClusters   = 16
	DefaultMaxResources  = 64
	DefaultMaxNamespaces = 256
	DefaultMaxKeys       = 2000
	DefaultMaxWriters    = 32
	DefaultHotObjects    = 10
	DefaultHotWindow     = 5 * time.Minute
)

// SignalOptions bound the label sets of the conflict signals. A value seen
// while its set has room gets its own series for the life of the process
// (counters must not move between series); later ones count under
// OtherLabel. Zero fields take the defaults.
type SignalOptions struct {
	// MaxClusters, MaxResources and MaxNamespaces bound each label;
	// defaulted to 16, 64 and 256.
	MaxClusters, MaxResources, MaxNamespaces int
	// MaxKeys bounds the (cluster, resource, namespace) series; a new
	// combination past it counts under namespace OtherLabel. Defaulted to
	// 2000.
	MaxKeys int
	// MaxWriters bounds the writer label; defaulted to 32. A writer gets a
	// series of its own at its first version conflict, so the bound is
	// spent on writers that conflict, not on the many that never do.
	MaxWriters int
	// HotObjects is how many hot objects are exported; defaulted to 10.
	HotObjects int
	// HotWindow is the sliding window the hot objects are counted over;
	// defaulted to 5m.
	HotWindow time.Duration
	// Now is the clock of the hot-object window; defaulted to time.Now.
	Now func() time.Time
}

func (o *SignalOptions) setDefaults() {
	def := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	def(&o.MaxClusters, DefaultMaxClusters)
	def(&o.MaxResources, DefaultMaxResources)
	def(&o.MaxNamespaces, DefaultMaxNamespaces)
	def(&o.MaxKeys, DefaultMaxKeys)
	def(&o.MaxWriters, DefaultMaxWriters)
	def(&o.HotObjects, DefaultHotObjects)
	if o.HotWindow <= 0 {
		o.HotWindow = DefaultHotWindow
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Signals are the conflict counters the storm alerts read, counted as the
// sink accepts each webhook batch (independent of ClickHouse), with the
// report's definitions: requests (audit.IsRequest), write attempts
// (audit.IsWrite) and 409s by class (audit.ConflictClass). They count a
// batch once per 200 answer: a batch the apiserver retries after a 503 is
// counted when it is stored, but one whose 200 was lost (a timeout) and
// that the apiserver sends again, to this replica or another, is counted
// twice. The report deduplicates; these counters are for rates, where a
// rare repeated batch moves a ratio by a fraction of a batch.
type Signals struct {
	o SignalOptions

	requests, writes *prometheus.CounterVec // cluster, resource, namespace
	conflicts        *prometheus.CounterVec // cluster, resource, namespace, class
	writerWrites     *prometheus.CounterVec // cluster, writer
	writerConflicts  *prometheus.CounterVec // cluster, writer (version conflicts)
	hot              *hotObjects

	mu                            sync.Mutex
	clusters                      map[string]bool
	resources, namespaces, writer map[string]map[string]bool // per cluster
	keys                          map[seriesKey]bool
}

type seriesKey struct{ cluster, resource, namespace string }

// NewSignals creates the conflict signals and registers them with reg (if
// not nil).
func NewSignals(reg prometheus.Registerer, o SignalOptions) *Signals {
	o.setDefaults()
	rn := []string{"cluster", "resource", "namespace"}
	s := &Signals{o: o,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "auditsink_requests_total",
			Help: "Requests in accepted webhook batches (ResponseComplete or Panic, dry runs excluded), by cluster, resource and namespace."}, rn),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "auditsink_write_attempts_total",
			Help: "Write attempts (create, update, patch, delete, deletecollection) in accepted webhook batches, by cluster, resource and namespace."}, rn),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "auditsink_conflicts_total",
			Help: "409 answers in accepted webhook batches by class (version, field, already_exists, delete_precondition, other), cluster, resource and namespace."},
			append(rn, "class")),
		writerWrites: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "auditsink_writer_write_attempts_total",
			Help: "Write attempts in accepted webhook batches by cluster and writer (writers past the bound, or without a version conflict yet, as _other)."},
			[]string{"cluster", "writer"}),
		writerConflicts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "auditsink_writer_version_conflicts_total",
			Help: "Version conflicts in accepted webhook batches by cluster and writer (bounded as auditsink_writer_write_attempts_total)."},
			[]string{"cluster", "writer"}),
		clusters: map[string]bool{}, resources: map[string]map[string]bool{},
		namespaces: map[string]map[string]bool{}, writer: map[string]map[string]bool{},
		keys: map[seriesKey]bool{},
	}
	s.hot = newHotObjects(o.HotWindow, o.HotObjects, o.Now)
	if reg != nil {
		reg.MustRegister(s.requests, s.writes, s.conflicts, s.writerWrites, s.writerConflicts, s.hot)
	}
	return s
}

// admit returns v if set has it or room for it (adding it), else
// OtherLabel.
func admit(set map[string]bool, v string, max int) string {
	if set[v] {
		return v
	}
	if len(set) >= max {
		return OtherLabel
	}
	set[v] = true
	return v
}

func sub(m map[string]map[string]bool, cluster string) map[string]bool {
	s := m[cluster]
	if s == nil {
		s = map[string]bool{}
		m[cluster] = s
	}
	return s
}

// Commit adds one accepted batch's tally of cluster to the counters and
// the hot objects.
func (s *Signals) Commit(cluster string, t *Tally) {
	if s == nil || t == nil || t.empty() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cluster = admit(s.clusters, cluster, s.o.MaxClusters)
	for k, c := range t.keys {
		res := admit(sub(s.resources, cluster), k.resourceLabel(), s.o.MaxResources)
		ns := k.namespace
		if ns != "" {
			ns = admit(sub(s.namespaces, cluster), ns, s.o.MaxNamespaces)
		}
		key := seriesKey{cluster, res, ns}
		if !s.keys[key] {
			if len(s.keys) >= s.o.MaxKeys {
				key.namespace = OtherLabel
			}
			s.keys[key] = true
			// Export the version conflicts at zero from the start, so
			// that rate() counts a first conflict.
			s.conflicts.WithLabelValues(key.cluster, key.resource, key.namespace, audit.ClassVersion)
		}
		s.requests.WithLabelValues(key.cluster, key.resource, key.namespace).Add(c.requests)
		if c.writes > 0 {
			s.writes.WithLabelValues(key.cluster, key.resource, key.namespace).Add(c.writes)
		}
		for i, n := range c.conflicts {
			if n > 0 {
				s.conflicts.WithLabelValues(key.cluster, key.resource, key.namespace, audit.ConflictClasses[i]).Add(n)
			}
		}
	}
	writers := sub(s.writer, cluster)
	for w, c := range t.writers {
		label := OtherLabel
		if writers[w] || c.version > 0 {
			label = admit(writers, w, s.o.MaxWriters)
		}
		s.writerWrites.WithLabelValues(cluster, label).Add(c.writes)
		s.writerConflicts.WithLabelValues(cluster, label).Add(c.version)
	}
	for _, h := range t.hot {
		h.obj.cluster = cluster
		s.hot.add(h.obj, h.writer)
	}
}

// Tally counts one batch's signals before the batch is answered; Commit
// adds it to the counters only once the batch is stored. A Tally is used
// by one request at a time; Reset readies it for the next.
type Tally struct {
	keys    map[tallyKey]*tallyCounts
	writers map[string]*writerCounts
	hot     []hotHit
}

type tallyKey struct{ group, resource, namespace string }

// resourceLabel is kubectl's spelling: "configmaps", "deployments.apps".
func (k tallyKey) resourceLabel() string {
	if k.group == "" {
		return k.resource
	}
	return k.resource + "." + k.group
}

type tallyCounts struct {
	requests, writes float64
	conflicts        [5]float64 // by audit.ConflictClasses
}

type writerCounts struct{ writes, version float64 }

type hotHit struct {
	obj    objectKey
	writer string
}

// NewTally returns an empty tally.
func NewTally() *Tally {
	return &Tally{keys: map[tallyKey]*tallyCounts{}, writers: map[string]*writerCounts{}}
}

// Reset empties t for the next batch.
func (t *Tally) Reset() {
	clear(t.keys)
	clear(t.writers)
	t.hot = t.hot[:0]
}

func (t *Tally) empty() bool { return len(t.keys) == 0 }

// Add counts one decoded row. Row strings may point into the reader's
// buffer, so every string kept is cloned.
func (t *Tally) Add(r *audit.Row) {
	if !audit.IsRequest(r) {
		return
	}
	k := tallyKey{r.APIGroup, r.Resource, r.Namespace}
	c := t.keys[k]
	if c == nil {
		c = &tallyCounts{}
		t.keys[tallyKey{strings.Clone(k.group), strings.Clone(k.resource), strings.Clone(k.namespace)}] = c
	}
	c.requests++
	if !audit.IsWrite(r) {
		return
	}
	c.writes++
	writer := r.Writer()
	w := t.writers[writer]
	if w == nil {
		w = &writerCounts{}
		writer = strings.Clone(writer)
		t.writers[writer] = w
	}
	w.writes++
	class := audit.ConflictClass(r)
	if class == "" {
		return
	}
	c.conflicts[slices.Index(audit.ConflictClasses, class)]++
	if class == audit.ClassVersion {
		w.version++
		t.hot = append(t.hot, hotHit{objectKey{resource: k.resourceLabel(), namespace: strings.Clone(r.Namespace), name: strings.Clone(r.Name)},
			strings.Clone(r.Writer())})
	}
}

// hotObjects finds the objects with the most version conflicts over a
// sliding window: the window is cut into hotBuckets buckets, each holding
// a Space-Saving summary of at most hotCapacity objects (a heavy hitter
// of the bucket is kept; its count may overestimate by the count of the
// object it replaced). A scrape sums the buckets inside the window and
// exports the top objects as auditsink_hot_object_version_conflicts.
type hotObjects struct {
	desc   *prometheus.Desc
	width  time.Duration
	top    int
	now    func() time.Time
	mu     sync.Mutex
	bucket [hotBuckets]hotBucket
}

const (
	hotBuckets  = 10
	hotCapacity = 64
	hotWriters  = 4
)

type objectKey struct{ cluster, resource, namespace, name string }

type hotBucket struct {
	start   int64 // bucket index (unix nanoseconds / width)
	entries map[objectKey]*hotEntry
}

type hotEntry struct {
	count   float64
	writers map[string]float64 // Space-Saving too, at most hotWriters
}

func newHotObjects(window time.Duration, top int, now func() time.Time) *hotObjects {
	h := &hotObjects{width: window / hotBuckets, top: top, now: now,
		desc: prometheus.NewDesc("auditsink_hot_object_version_conflicts",
			"Version conflicts over the last window (5m by default) on the objects with the most (an estimate: a bounded heavy-hitters summary), with the writer that hit most of them.",
			[]string{"cluster", "resource", "namespace", "name", "writer"}, nil)}
	if h.width <= 0 {
		h.width = time.Second
	}
	return h
}

// spaceSave adds one to key in m (at most max keys): a key not present
// replaces the smallest, starting from its count.
func spaceSave[K comparable](m map[K]float64, key K, max int) {
	if _, ok := m[key]; ok || len(m) < max {
		m[key]++
		return
	}
	var minKey K
	minVal := -1.0
	for k, v := range m {
		if minVal < 0 || v < minVal {
			minKey, minVal = k, v
		}
	}
	delete(m, minKey)
	m[key] = minVal + 1
}

func (h *hotObjects) add(obj objectKey, writer string) {
	idx := h.now().UnixNano() / int64(h.width)
	h.mu.Lock()
	defer h.mu.Unlock()
	b := &h.bucket[idx%hotBuckets]
	if b.start != idx || b.entries == nil {
		b.start, b.entries = idx, map[objectKey]*hotEntry{}
	}
	e := b.entries[obj]
	if e == nil {
		if len(b.entries) >= hotCapacity {
			var minKey objectKey
			var minEntry *hotEntry
			for k, v := range b.entries {
				if minEntry == nil || v.count < minEntry.count {
					minKey, minEntry = k, v
				}
			}
			delete(b.entries, minKey)
			e = &hotEntry{count: minEntry.count, writers: map[string]float64{}}
		} else {
			e = &hotEntry{writers: map[string]float64{}}
		}
		b.entries[obj] = e
	}
	e.count++
	spaceSave(e.writers, writer, hotWriters)
}

// Describe implements prometheus.Collector.
func (h *hotObjects) Describe(ch chan<- *prometheus.Desc) { ch <- h.desc }

// Collect implements prometheus.Collector: the top objects of the window.
func (h *hotObjects) Collect(ch chan<- prometheus.Metric) {
	type row struct {
		obj     objectKey
		count   float64
		writers map[string]float64
	}
	idx := h.now().UnixNano() / int64(h.width)
	h.mu.Lock()
	sum := map[objectKey]*row{}
	for i := range h.bucket {
		b := &h.bucket[i]
		if b.entries == nil || b.start <= idx-hotBuckets || b.start > idx {
			continue
		}
		for k, e := range b.entries {
			r := sum[k]
			if r == nil {
				r = &row{obj: k, writers: map[string]float64{}}
				sum[k] = r
			}
			r.count += e.count
			for w, n := range e.writers {
				r.writers[w] += n
			}
		}
	}
	h.mu.Unlock()
	rows := make([]*row, 0, len(sum))
	for _, r := range sum {
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b *row) int {
		return cmp.Or(cmp.Compare(b.count, a.count), cmp.Compare(a.obj.cluster, b.obj.cluster),
			cmp.Compare(a.obj.namespace, b.obj.namespace), cmp.Compare(a.obj.resource, b.obj.resource), cmp.Compare(a.obj.name, b.obj.name))
	})
	for _, r := range rows[:min(len(rows), h.top)] {
		writer, most := "", -1.0
		for w, n := range r.writers {
			if n > most || n == most && w < writer {
				writer, most = w, n
			}
		}
		ch <- prometheus.MustNewConstMetric(h.desc, prometheus.GaugeValue, r.count,
			r.obj.cluster, r.obj.resource, r.obj.namespace, r.obj.name, writer)
	}
}
