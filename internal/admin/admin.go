// Package admin owns spillway-admin, the operator's command for the
// dead-letter queue: list, show, replay and purge (docs/OPERATIONS.md,
// "Dead letters: spillway-admin"). It works on a Store (Redis Streams, every
// shard, or the Kafka dead-letter topic) and replays through the same
// queued path the api uses (failover.Spiller): subscribe to the result
// channel, then enqueue under a new request id, then relay the answer. It
// holds no backend and creates no client: internal/app adapts the queues
// to Store and wires the tool from the configuration.
package admin

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/streamlog"
)

// Exit statuses of the command (docs/OPERATIONS.md lists them too).
const (
	// ExitOK: everything asked for was done.
	ExitOK = 0
	// ExitFailed: the backend failed, or a replay did not end in done.
	ExitFailed = 1
	// ExitUsage: a wrong command, flag or argument, or a configuration
	// the tool cannot work with.
	ExitUsage = 2
	// ExitAborted: the confirmation was refused or could not be asked.
	ExitAborted = 3
	// ExitNotFound: a dead letter named on the command line does not
	// exist; nothing was done.
	ExitNotFound = 4
	// ExitNotReplayable: a dead letter cannot be replayed because its job
	// was not kept (DEAD_LETTER_KEEP_PAYLOAD=false when it failed) or does
	// not decode.
	ExitNotReplayable = 5
)

// MaxBatch bounds how many dead letters one replay batch enqueues: a
// batch's answers end before the next batch starts, so a replay of
// thousands adds at most this many jobs to the queue at a time.
const MaxBatch = 50

// listPage is how many records list reads per round trip.
const listPage = 100

// Config configures the tool. Zero fields take the stated defaults.
type Config struct {
	// Backend names the queue in messages: "redis" or "kafka".
	Backend string
	// KeepPayload is DEAD_LETTER_KEEP_PAYLOAD, for the hint shown with a
	// dead letter that has no job to replay.
	KeepPayload bool
	// OverflowThreshold is QUEUE_OVERFLOW_THRESHOLD: a replay batch that
	// would take the backlog over it is not started. 0 checks nothing.
	OverflowThreshold int64
	// StreamLogTTL is STREAM_LOG_TTL_SECONDS, how long a replay's answer
	// stays in its stream log, for the messages.
	StreamLogTTL time.Duration
}

// EventLog keeps the events of a replay in its stream log, so the answer
// can be read back on any api with GET /v1/streams/{id}
// (streamlog.Appender implements it). Safe for concurrent use; it never
// blocks.
type EventLog interface {
	Open(requestID, owner string) bool
	Append(requestID string, ev streamlog.Event) bool
}

// Deps are what the tool uses; it closes none of them.
type Deps struct {
	// Store holds the dead letters. Required.
	Store Store
	// Spiller replays a job: subscribe, enqueue, relay. Required.
	Spiller failover.Spiller
	// Depth is the job queue's backlog, for the overflow check; nil
	// checks nothing.
	Depth failover.Depther
	// Log, when set, keeps every replay's events in its stream log.
	Log EventLog
	// Stdin answers the confirmation; Stdout gets the results, Stderr
	// the progress and the errors. Required.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Logger gets what the tool logs. Required.
	Logger *slog.Logger
}

// Tool runs one command line. Not safe for concurrent use.
type Tool struct {
	cfg  Config
	deps Deps
	in   *bufio.Reader
}

// New returns the tool.
func New(cfg Config, deps Deps) (*Tool, error) {
	if deps.Store == nil || deps.Spiller == nil || deps.Stdin == nil || deps.Stdout == nil || deps.Stderr == nil || deps.Logger == nil {
		return nil, errors.New("admin: needs a store, a spiller, stdin, stdout, stderr and a logger")
	}
	if cfg.OverflowThreshold < 0 || cfg.StreamLogTTL < 0 {
		return nil, errors.New("admin: OverflowThreshold and StreamLogTTL must not be negative")
	}
	if cfg.Backend == "" {
		cfg.Backend = "redis"
	}
	return &Tool{cfg: cfg, deps: deps, in: bufio.NewReader(deps.Stdin)}, nil
}

// Usage is the command's help text.
const Usage = `usage: spillway-admin [-config FILE] COMMAND [FLAGS] [ID...]

Dead letters of the queue QUEUE_TYPE names, with the settings of the other
Spillway processes (environment, or -config FILE, environment winning).

commands:
  list    [-n N] [-after CURSOR] [-json]
          the oldest N dead letters (default 100), or those after CURSOR
  show    [-json] ID
          one dead letter, with its prompt when the job was kept
  replay  [-yes] [-detach] [-batch N] (-all | ID...)
          enqueue each job again under a new request id and print the
          answer; -detach prints only "<id> <new request id>" lines; at
          most 50 jobs at a time (-batch lowers it); a replay that ends in
          done deletes its dead letter (Redis Streams)
  purge   [-yes] (-all | ID...)
          delete dead letters (-all on Kafka: the topic is recreated)
  help    this text

replay and purge ask for confirmation on standard input unless -yes.

exit status: 0 done; 1 failed (backend error, or a replay did not end in
done); 2 usage or configuration error; 3 not confirmed; 4 a named dead
letter does not exist; 5 a dead letter cannot be replayed (job not kept)
`

// commands are the command names Run knows.
var commands = map[string]bool{"list": true, "show": true, "replay": true, "purge": true}

// Preflight handles what needs no backend: no command (usage on stderr,
// ExitUsage), help (usage on stdout, ExitOK) and an unknown command
// (ExitUsage). done reports that it handled args and code is the exit
// status; otherwise the caller builds the tool and calls Run.
func Preflight(args []string, stdout, stderr io.Writer) (code int, done bool) {
	if len(args) == 0 {
		fmt.Fprint(stderr, Usage)
		return ExitUsage, true
	}
	switch cmd := args[0]; {
	case cmd == "help" || cmd == "-h" || cmd == "-help" || cmd == "--help":
		fmt.Fprint(stdout, Usage)
		return ExitOK, true
	case !commands[cmd]:
		fmt.Fprintf(stderr, "spillway-admin: unknown command %q\n\n%s", cmd, Usage)
		return ExitUsage, true
	}
	return ExitOK, false
}

// Run runs the command in args (without the program name and global
// flags) and returns the exit status. ctx ending (SIGINT) stops a replay:
// its jobs are cancelled and their dead letters kept.
func (t *Tool) Run(ctx context.Context, args []string) int {
	if code, done := Preflight(args, t.deps.Stdout, t.deps.Stderr); done {
		return code
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "list":
		return t.list(ctx, rest)
	case "show":
		return t.show(ctx, rest)
	case "replay":
		return t.replay(ctx, rest)
	default: // "purge"
		return t.purge(ctx, rest)
	}
}

// flags returns a flag set for command name that reports to stderr.
func (t *Tool) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("spillway-admin "+name, flag.ContinueOnError)
	fs.SetOutput(t.deps.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(t.deps.Stderr, "usage of spillway-admin %s:\n", name)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args with fs, so that flags may also follow the ids
// ("replay ID -yes"); it reports false on a usage error, already printed.
func parse(fs *flag.FlagSet, args []string) ([]string, bool) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, false
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, true
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// failf prints an error line and returns code.
func (t *Tool) failf(code int, format string, args ...any) int {
	fmt.Fprintf(t.deps.Stderr, "spillway-admin: "+format+"\n", args...)
	return code
}

// confirm asks question on stderr and reads the answer from stdin: only
// "y" or "yes" goes on. No answer (stdin closed or not a terminal with
// nothing to read) does not.
func (t *Tool) confirm(question string) bool {
	fmt.Fprintf(t.deps.Stderr, "%s [y/N] ", question)
	line, err := t.in.ReadString('\n')
	answer := strings.ToLower(strings.TrimSpace(line))
	if err != nil && answer == "" {
		fmt.Fprintln(t.deps.Stderr, "\nspillway-admin: no answer on standard input; pass -yes to go on without asking")
		return false
	}
	return answer == "y" || answer == "yes"
}

// backendErr is the message of a failed backend call.
func (t *Tool) backendErr(what string, err error) int {
	return t.failf(ExitFailed, "%s: %v", what, err)
}
