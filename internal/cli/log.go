package cli

import (
	"io"
	"log/slog"
)

// NewLogger is a command's logger on w, as its --log-level and
// --log-format say. Errors are UsageErrors naming the flag.
func NewLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, Usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: DurationsAsText}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, Usagef("--log-format %q: want json or text", format)
}
