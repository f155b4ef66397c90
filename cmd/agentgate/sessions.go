package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/supervisor"
	"github.com/rivo/uniseg"
)

const sessionsUsage = `usage: agentgate sessions <command> [flags] [KEY]

commands:
  list          list session keys with their current session (--platform, --limit, --after, --json)
  show KEY      show a key's route, current session, counts and last messages (--json)
  export KEY    print the key's sessions (current and predecessors), transcripts and outbox as JSON
  reset KEY     end the key's current session. Through the daemon (or a cluster member) when
                one runs: a new session starts at once, and one nothing was said in yet is
                left as it is. Otherwise in the database: the key's next message starts one
  requeue KEY MESSAGE_ID
                run a quarantined message again, after the messages waiting, as its sender's
                (through the running daemon or a cluster member; refused when none runs)
  search QUERY  find messages by their text, best match first (--limit, --json)
  quarantined   list quarantined messages across sessions, newest first, with what a requeue
                names (--limit, --json)
  pardon (--all | KEY)
                clear the unclean stops of agentgate counted against pending messages, so that
                they run as any other again (no probation); the daemon must be stopped

Every command takes --config and --data-dir, after its name. list, show, export, search and
quarantined are safe while the daemon runs. Run 'agentgate sessions <command> -h' for what a
command takes, and how a KEY is read.
`

// sessionsCommandUsage is what the -h of each sessions command prints before its flags: its
// arguments and what they are (before, the flags alone, and KEY and MESSAGE_ID went unsaid).
var sessionsCommandUsage = map[string]string{
	"sessions list": `usage: agentgate sessions list [flags]

Lists session keys, sorted, with their current session. A key that holds a character that does
not display, a space or a quote is printed Go-quoted inside single quotes, as every command that
takes a KEY, and --after, read it back (see agentgate sessions show -h).
`,
	"sessions show": `usage: agentgate sessions show [flags] KEY

Shows KEY's route, current session, counts and last messages.
` + keyHelp,
	"sessions export": `usage: agentgate sessions export [flags] KEY

Prints KEY's sessions (current and predecessors), transcripts and outbox as JSON.
` + keyHelp,
	"sessions reset": `usage: agentgate sessions reset [flags] KEY

Ends KEY's current session.

While the daemon (or a cluster member) runs, it resets the session: it cancels the session's
running turn, tells the senders of its unanswered messages, and starts a new, empty session at
once, which the command names. A session nothing was said in yet (one a reset or /new began,
with no message since, and no /queue mode or /title set in it) is left as it is: resetting a key
twice starts one new session, not two.

With no daemon running, the session is ended in the database and the key's next message starts
a new one; a session that has ended already is left as it is ("already ended"), and so is one
nothing was said in yet ("holds no conversation yet": commands and notices, which sessions
show counts among its messages, do not count). Writes waiting in data_dir/spool (the database
refused them, and the daemon stopped before it could store them) are replayed into the
database first, as the next start would replay them, so that the reset sees them; no unclean
stop is counted for it. If agentgate did not stop cleanly last time, the next start still
counts that stop against the messages waiting in the other sessions, any of which may have
caused it (sessions pardon --all forgets it); the ended session's, marked failed, are spared.
` + keyHelp,
	"sessions requeue": `usage: agentgate sessions requeue [flags] KEY MESSAGE_ID

Runs the quarantined message MESSAGE_ID of the session key KEY again, after the messages
waiting, as its sender's (through the running daemon or a cluster member; refused when none
runs). sessions quarantined prints both.
` + keyHelp,
	"sessions search": `usage: agentgate sessions search [flags] QUERY

Finds messages by their text, best match first.

In QUERY, ` + searchHelp + `.
`,
	"sessions pardon": pardonUsage,
	"sessions quarantined": `usage: agentgate sessions quarantined [flags]

Lists quarantined messages across sessions, newest first, with the KEY and MESSAGE_ID that
sessions requeue takes.
`,
}

// keyHelp says what a KEY argument is, and how an argument that may be quoted is read (keyArg).
const keyHelp = `
KEY is a session key (agent:<profile>:<platform>:<chat type>:<chat id>[:...]), as sessions list
prints it: raw, or Go-quoted inside single quotes ('"agent:main:http:dm:a\u200eb"') when it
holds a character that does not display, a space or a quote; paste it as it is printed. An
argument that begins with " and is one whole Go-quoted string is read quoted, any other raw:
every key begins with agent:, so no key reads both ways.
`

// Limits of the sessions commands.
const (
	defaultListPage = 50
	showMessages    = 10   // messages printed by show
	showTextRunes   = 80   // text runes per message line of show
	maxIncarnations = 1000 // predecessors followed by export
)

// transcriptPage is how many messages show and export read at a time: a transcript of any
// length is never held whole (a variable so that tests can make pages small).
var transcriptPage = 500

// sessions runs `agentgate sessions <list|show|export|reset|requeue|search|quarantined|pardon>`.
func sessions(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, sessionsUsage)
		return errUsage
	}
	if strings.HasPrefix(args[0], "-") && !isHelpFlag(args[0]) {
		// agentgate sessions --data-dir DIR list: before, the usage alone, which did not say
		// what was wrong (found by a new operator's walkthrough).
		fmt.Fprintf(stderr, "agentgate sessions: the command comes first, then its flags (agentgate sessions list --data-dir DIR); got the flag %q first\n\n%s",
			args[0], sessionsUsage)
		return errUsage
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "list":
		return sessionsList(ctx, args, stdout, stderr)
	case "show":
		return sessionsShow(ctx, args, stdout, stderr)
	case "export":
		return sessionsExport(ctx, args, stdout, stderr)
	case "reset":
		return sessionsReset(ctx, args, stdout, stderr)
	case "requeue":
		return sessionsRequeue(ctx, args, stdout, stderr)
	case "search":
		return sessionsSearch(ctx, args, stdout, stderr)
	case "quarantined":
		return sessionsQuarantined(ctx, args, stdout, stderr)
	case "pardon":
		return sessionsPardon(ctx, args, stdout, stderr)
	case "help", "-h", "--h", "-help", "--help":
		fmt.Fprint(stdout, sessionsUsage)
		return nil
	}
	fmt.Fprintf(stderr, "agentgate sessions: unknown command %q\n\n%s", sub, sessionsUsage)
	return errUsage
}

func sessionsList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fset := flag.NewFlagSet("sessions list", flag.ContinueOnError)
	var cf configFlags
	cf.registerAdmin(fset, false)
	asJSON := fset.Bool("json", false, "print one JSON array")
	platform := fset.String("platform", "", "only sessions of this `platform`")
	limit := fset.Int("limit", defaultListPage, "at most `N` keys")
	after := fset.String("after", "", "only keys sorted after `KEY` (paging), raw or Go-quoted as the more: hint prints it (read as a KEY argument is: see sessions show -h)")
	if _, err := parseSessionArgs(fset, args, false, stdout, stderr); err != nil {
		return helpIsDone(err)
	}
	if *limit < 1 {
		return usagef("sessions list: --limit %d: must be at least 1", *limit)
	}
	// --after is a position, not necessarily a key, so it is not parsed as one; but a value
	// that begins with a quote names no key (each begins with "agent:") and, read raw, would
	// list from the first key: it is refused.
	afterKey, badQuote := keyArg(*after)
	if badQuote != nil {
		return usagef("sessions list: --after %s: begins with a quote but is not Go-quoted as the more: hint prints a key (%v)",
			shortQuote(*after), badQuote)
	}
	st, err := openReader(ctx, &cf, 0, stderr)
	if err != nil {
		return err
	}
	defer st.Close()
	// The keys are read and printed a page at a time, so that a list of every key (--limit
	// past their number, --json for a script) holds one page in memory, not the whole list:
	// before, 100,000 sessions took 207 MB as a table and 451 MB as JSON.
	pages := listPager{st: st, f: persistence.ListFilter{Platform: *platform, AfterKey: afterKey}, left: *limit}
	sums, err := pages.next(ctx)
	if err != nil {
		return err
	}
	found := len(sums) > 0
	if *asJSON {
		j := newJSONStream(stdout)
		j.open("[")
		for ; len(sums) > 0; sums, err = pages.next(ctx) {
			for _, s := range sums {
				j.item(listJSON{Session: sessionToJSON(&s.Session), Messages: s.Messages, Pending: s.Pending})
			}
			j.flush()
		}
		if err != nil {
			return err
		}
		j.close("]")
		if err := j.end(); err != nil {
			return err
		}
	} else if found {
		// Each page is aligned as it is printed; a column only widens from one page to the
		// next (sticky), so the table stays aligned unless a later page holds a wider cell.
		tw := newTable(stdout)
		tw.sticky = true
		fmt.Fprintln(tw, "KEY\tSESSION ID\tPLATFORM\tMESSAGES\tPENDING\tLAST ACTIVITY\tENDED")
		for ; len(sums) > 0; sums, err = pages.next(ctx) {
			for _, s := range sums {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", keyCell(s.Session.Key), cell(s.Session.ID),
					cell(s.Session.Platform), s.Messages, s.Pending, timeCell(s.Session.LastActivityAt), ended(&s.Session))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
		if err != nil {
			return err
		}
	}
	if !found {
		// A note on stderr, with --json too, as search, quarantined and export say theirs:
		// a table printed none (before, a header over no rows: found by a new operator's
		// walkthrough), and --json printed [] alone (a CLI review).
		if *platform != "" || afterKey != "" {
			fmt.Fprintln(stderr, "no session key matches")
		} else {
			fmt.Fprintln(stderr, "no session is stored yet")
		}
	}
	if pages.more {
		fmt.Fprintf(stderr, "more: --after %s\n", pasteableKey(pages.f.AfterKey))
	}
	return nil
}

// listPage is how many keys sessions list reads at a time (a variable so that tests can make
// pages small).
var listPage = 1000

// listPager reads the keys sessions list prints, a page at a time, up to left of them, and
// says whether more follow the last.
type listPager struct {
	st   persistence.Store
	f    persistence.ListFilter // AfterKey: the last key read
	left int                    // keys still to print
	more bool                   // a key that matches follows the last one printed
	done bool
}

// next returns the next page, empty once left keys were read or none follow.
func (p *listPager) next(ctx context.Context) ([]persistence.SessionSummary, error) {
	if p.done {
		return nil, nil
	}
	// One row more than the page when it is the last one asked for tells whether more follow:
	// the paging hint names a next page only then, as GET /v1/sessions's next does.
	n := min(p.left, listPage)
	ask := n
	if n == p.left && ask < math.MaxInt {
		ask++
	}
	p.f.Limit = ask
	sums, err := p.st.ListSessions(ctx, p.f)
	if err != nil {
		return nil, err
	}
	if len(sums) < ask {
		p.done = true // none follow
	}
	if len(sums) > n {
		sums = sums[:n]
		p.more, p.done = true, true
	}
	p.left -= len(sums)
	if p.left == 0 {
		p.done = true
	}
	if len(sums) > 0 {
		p.f.AfterKey = sums[len(sums)-1].Session.Key
	}
	return sums, nil
}

func sessionsShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fset := flag.NewFlagSet("sessions show", flag.ContinueOnError)
	var cf configFlags
	cf.registerAdmin(fset, false)
	asJSON := fset.Bool("json", false, "print one JSON object")
	key, err := parseSessionArgs(fset, args, true, stdout, stderr)
	if err != nil {
		return helpIsDone(err)
	}
	st, err := openReader(ctx, &cf, 0, stderr)
	if err != nil {
		return err
	}
	defer st.Close()
	snap, err := st.LoadSession(ctx, key, 0, 1) // (pending messages are counted below, page by page)
	if err != nil {
		return err
	}
	if snap.Route == nil {
		return noSession("sessions show", key, "")
	}
	out := showJSON{
		SessionKey: key,
		Route:      routeJSON{SessionKey: snap.Route.Key, SessionID: snap.Route.SessionID, Generation: snap.Route.Generation, UpdatedAt: utc(snap.Route.UpdatedAt)},
		Outbox:     outboxCountsJSON{LastSeq: snap.LastOutboxSeq, Undelivered: len(snap.Unconfirmed)},
		Last:       []messageJSON{},
	}
	switch own, err := st.Ownership(ctx, key); {
	case err == nil:
		out.Claim = &claimJSON{Owner: own.Owner, Epoch: own.Epoch, ClaimedAt: utc(own.ClaimedAt)}
	case !errors.Is(err, persistence.ErrNotFound):
		return err
	}
	if snap.Session != nil {
		sj := sessionToJSON(snap.Session)
		out.Session = &sj
		// The counts and the last messages, read page by page: only showMessages are kept.
		var last []persistence.Message
		err := eachTranscriptPage(ctx, st, snap.Session.ID, func(ms []persistence.Message) error {
			for _, m := range ms {
				out.Counts.Messages++
				if m.Archived {
					out.Counts.Archived++
				}
				if m.Role == persistence.RoleUser && m.Status == persistence.StatusPending && m.Active {
					out.Counts.Pending++
				}
				if m.Role == persistence.RoleUser && m.Status == persistence.StatusFailed {
					out.Counts.Failed++
				}
			}
			last = append(last, ms[max(0, len(ms)-showMessages):]...)
			last = last[max(0, len(last)-showMessages):]
			return nil
		})
		if err != nil {
			return err
		}
		for _, m := range last {
			out.Last = append(out.Last, messageToJSON(&m))
		}
	}
	if *asJSON {
		return writeJSON(stdout, out)
	}
	return printShow(stdout, &out)
}

// printShow renders show's text form: key/value lines, then one line per message.
func printShow(w io.Writer, o *showJSON) error {
	tw := newTable(w)
	r := o.Route
	fmt.Fprintf(tw, "key:\t%s\n", keyCell(o.SessionKey))
	fmt.Fprintf(tw, "route:\tsession %s, generation %d, updated %s\n", cell(r.SessionID), r.Generation, timeCell(r.UpdatedAt))
	// The key's owner row: which cluster member's activation runs the key, or ran it last.
	if c := o.Claim; c == nil {
		fmt.Fprintln(tw, "claim:\tnone (only a cluster's members claim a key)")
	} else {
		fmt.Fprintf(tw, "claim:\t%s, epoch %d, claimed %s\n", cell(c.Owner), c.Epoch, timeCell(c.ClaimedAt))
	}
	// "current session", not "session": the one the key's route names, which its next
	// message goes to while it is open (before, an operator could not tell it was: a CLI
	// review).
	if s := o.Session; s == nil {
		fmt.Fprintf(tw, "current session:\t%s (gone: pruned after it ended)\n", cell(r.SessionID))
	} else {
		// The ids the key is made of are shown as the key is (keyCell): Go-quoted when one holds
		// a character that does not display, which cell would show as U+FFFD, so that it can be
		// told from the key's part it is. Before, the chat id line showed U+FFFD.
		for _, kv := range [][2]string{
			{"current session", cell(s.ID)}, {"platform", cell(s.Platform)}, {"chat type", cell(s.ChatType)}, {"chat id", keyCell(s.ChatID)},
			{"thread id", keyCell(s.ThreadID)}, {"user id", keyCell(s.UserID)}, {"user name", cell(s.UserName)},
			{"scope id", keyCell(s.ScopeID)}, {"profile", cell(s.Profile)}, {"title", cell(s.Title)},
			{"epoch", fmt.Sprint(s.Epoch)}, {"started", timeCell(s.StartedAt)},
			{"last activity", timeCell(s.LastActivityAt)}, {"previous session", cell(s.PrevSessionID)},
		} {
			fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
		}
		if s.EndedAt.IsZero() {
			fmt.Fprintln(tw, "ended:\topen")
			if s.ResetDueReason != "" {
				// A reset that fell due while the session worked (persistence.MarkResetDue): the
				// daemon ends the session at that time once its work is done.
				// A mark with no time is one of a session with no valid activity time, due at
				// once (ResetPolicy.Due). Before, it read "idle at -".
				due := " at " + timeCell(s.ResetDueAt)
				if s.ResetDueAt.IsZero() {
					due = " (its last activity has no valid time)"
				}
				fmt.Fprintf(tw, "reset due:\t%s%s, once its work is done\n", cell(s.ResetDueReason), due)
			}
		} else {
			fmt.Fprintf(tw, "ended:\t%s (%s): the key's next message starts a new session\n", timeCell(s.EndedAt), cell(s.EndReason))
		}
		c := o.Counts
		fmt.Fprintf(tw, "messages:\t%d (pending %d, failed %d, archived %d)\n", c.Messages, c.Pending, c.Failed, c.Archived)
		fmt.Fprintf(tw, "tokens:\tinput %d, output %d\n", s.InputTokens, s.OutputTokens)
	}
	fmt.Fprintf(tw, "outbox:\tlast seq %d, undelivered %d\n", o.Outbox.LastSeq, o.Outbox.Undelivered)
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(o.Last) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nlast %d messages:\n", len(o.Last))
	tw = newTable(w)
	fmt.Fprintln(tw, "SEQ\tROLE\tSTATUS\tMESSAGE ID\tTEXT") // (a quarantined message is requeued by its id)
	for _, m := range o.Last {
		status := m.Status
		switch {
		case m.Archived:
			status += ",archived"
		case !m.Active:
			status += ",inactive"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", m.Seq, cell(m.Role), cell(status), cell(m.MessageID), oneLine(m.Text, showTextRunes))
	}
	return tw.Flush()
}

func sessionsExport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fset := flag.NewFlagSet("sessions export", flag.ContinueOnError)
	var cf configFlags
	cf.registerAdmin(fset, false)
	key, err := parseSessionArgs(fset, args, true, stdout, stderr)
	if err != nil {
		return helpIsDone(err)
	}
	st, err := openReader(ctx, &cf, 0, stderr)
	if err != nil {
		return err
	}
	defer st.Close()
	route, err := st.Route(ctx, key)
	if errors.Is(err, persistence.ErrNotFound) {
		return noSession("sessions export", key, "")
	}
	if err != nil {
		return err
	}
	// The object is written as it is read, a page of messages or replies at a time, in the
	// form writeJSON gives it (exportJSON): an export of any length is never held whole.
	// Sessions go newest first: the routed one, then each predecessor; a missing row or a
	// cycle ends the chain.
	jw := newJSONStream(stdout)
	jw.open("{")
	jw.field("session_key", key)
	jw.field("exported_at", time.Now().UTC())
	jw.open(`"sessions": [`)
	seen := map[string]bool{}
	exported, messages := 0, 0
	for id := route.SessionID; id != "" && !seen[id] && len(seen) < maxIncarnations; {
		seen[id] = true
		s, err := st.Session(ctx, id)
		if errors.Is(err, persistence.ErrNotFound) {
			break
		}
		if err != nil {
			return err
		}
		jw.open("{")
		jw.field("session", sessionToJSON(s))
		jw.open(`"messages": [`)
		err = eachTranscriptPage(ctx, st, id, func(ms []persistence.Message) error {
			for _, m := range ms {
				jw.item(messageToJSON(&m))
			}
			messages += len(ms)
			return jw.err
		})
		if err != nil {
			return err
		}
		jw.close("]")
		jw.close("}")
		exported++
		id = s.PrevSessionID
	}
	jw.close("]")
	jw.open(`"outbox": [`)
	for after := int64(0); ; {
		entries, err := st.OutboxAfter(ctx, key, after, transcriptPage)
		if err != nil {
			return err
		}
		// Only an empty page ends the outbox: a page also ends early once its texts pass
		// persistence.OutboxPageBytes.
		if len(entries) == 0 {
			break
		}
		for _, e := range entries {
			jw.item(outboxToJSON(&e))
		}
		if jw.err != nil {
			break
		}
		after = entries[len(entries)-1].Seq
	}
	jw.close("]")
	jw.close("}")
	if err := jw.end(); err != nil {
		return err
	}
	if messages == 0 {
		// Said as list, search and quarantined say they found nothing: before, an export of
		// empty arrays came without a word (a CLI review).
		fmt.Fprintln(stderr, exportHoldsNoMessage(key, route.SessionID, exported))
	}
	return nil
}

// exportHoldsNoMessage is the note of an export of key that holds no message: its n sessions
// hold none, or its current session, current, is pruned (n is 0).
func exportHoldsNoMessage(key, current string, n int) string {
	switch n {
	case 0:
		return fmt.Sprintf("the current session %s of %s was pruned after it ended: the export holds its outbox only", current, pasteableKey(key))
	case 1:
		return fmt.Sprintf("no message is stored in the 1 session of %s: the export holds its session and outbox only", pasteableKey(key))
	}
	return fmt.Sprintf("no message is stored in the %d sessions of %s: the export holds its sessions and outbox only", n, pasteableKey(key))
}

// eachTranscriptPage calls fn with the messages of a session (archived ones included), by seq,
// transcriptPage at a time, or fewer once their texts pass persistence.TranscriptPageBytes.
func eachTranscriptPage(ctx context.Context, st persistence.Store, sessionID string, fn func([]persistence.Message) error) error {
	for after := int64(0); ; {
		ms, err := st.TranscriptAfter(ctx, sessionID, after, transcriptPage)
		if err != nil {
			return err
		}
		// Only an empty page ends the transcript, as the outbox: a page of large messages
		// also ends early.
		if len(ms) == 0 {
			return nil
		}
		if err := fn(ms); err != nil {
			return err
		}
		after = ms[len(ms)-1].Seq
	}
}

func sessionsReset(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fset := flag.NewFlagSet("sessions reset", flag.ContinueOnError)
	var cf configFlags
	cf.registerAdmin(fset, true)
	key, err := parseSessionArgs(fset, args, true, stdout, stderr)
	if err != nil {
		return helpIsDone(err)
	}
	// As the errors name the key: its characters reach no terminal raw, and of a KEY of any
	// length that may name no session, the first bytes only. What is printed of a session the
	// reset found names its key whole.
	shown := shortKey(key)
	// The data directory's lock first, as a daemon takes it (openStoreWith): a daemon that is
	// starting holds it before it opens the store. Before, the reset took only the store's lock
	// then, and ended the session in the store under the starting daemon (and could fail its
	// start); now it goes the way of a running daemon's.
	st, cfg, dirLock, err := openStoreWith(ctx, &cf, storeWrite, 0)
	if errors.Is(err, persistence.ErrLocked) {
		// The daemon holds the data directory or the database: it resets the session itself.
		where := lockedPlace(cfg, err)
		addr, run, recorded := daemonAddr(cfg)
		if !recorded {
			return fmt.Errorf("the daemon is running on this %s, but it records no address in %s (it starts, or it runs on another host); reset through it: %s",
				where, cfg.DataDir, resetCommand(cfg, key))
		}
		info, err := daemonReset(ctx, cfg, addr, run, key)
		if isNotTheDaemon(err) {
			// A record another run left (a daemon killed with -9), or one not written yet: its
			// address may be another process's, which the curl must not name.
			return fmt.Errorf("the daemon is running on this %s, but %v; reset through it where it listens (its log says: listening on ADDRESS): %s",
				where, err, resetCommandAt(cfg, "ADDRESS", key))
		}
		if errors.Is(err, errNoAnswer) {
			return fmt.Errorf("the daemon is running on this %s, but %v; reset through it when it answers: %s", where, err, resetCommand(cfg, key))
		}
		if errors.Is(err, errAnswerLost) {
			return answerLost(key, err)
		}
		if errors.Is(err, errStopping) {
			return fmt.Errorf("reset %s: %v; run it again once the daemon has restarted, or with it stopped", shortKey(key), err)
		}
		if errors.Is(err, errNoSession) {
			return noSession("sessions reset", key, "reset")
		}
		if err != nil {
			return fmt.Errorf("reset %s: %w", shortKey(key), err) // (a refusal: one too long for a request)
		}
		printDaemonReset(stdout, key, addr, info)
		return nil
	}
	if err != nil {
		return err
	}
	if dirLock != nil {
		defer dirLock.Close() // (after the store's: deferred calls run last in, first out)
	}
	defer st.Close()
	if cfg.Cluster.Enabled {
		// A live member resets the session as the daemon's own reset does, on the member that
		// runs it, cancelling its running turn.
		if done, err := resetThroughMember(ctx, st, cfg, key, stdout, stderr); done || err != nil {
			return err
		}
	}
	// Writes the daemon spooled while the database was unavailable are not in it yet: a reset
	// read without them would end the session under them (a pending message among them never
	// settled, the next start's replay adding it to the ended session) and take the outbox seq
	// of one of them. They go into the database first, as the daemon's next start would replay
	// them (a cluster keeps no spool).
	if err := replaySpoolFirst(ctx, st, cfg, offlineAct{prefix: "reset " + shown, name: "reset", done: "reset"}, stderr); err != nil {
		return err
	}
	var fence []persistence.Op
	if cfg.Cluster.Enabled {
		// No member answers (or none runs). The members share the database (they, and this
		// command, hold the daemon lock shared): claim the key as a session activation does,
		// so that a member running it after all hands over at its next write (and the next
		// activation loads the ended session), and load the state after the claim. A turn
		// such a member runs is not cancelled: its result is fenced.
		claimed, err := st.Claim(ctx, key, persistence.ResetClaimOwner, time.Now(), nil)
		if err != nil {
			return fmt.Errorf("reset %s: %w", shown, err)
		}
		fence = []persistence.Op{&persistence.Fence{Key: key, Epoch: claimed.Epoch}}
	}
	snap, err := st.LoadSession(ctx, key, 0, 1)
	if err != nil {
		return err
	}
	if snap.Route == nil {
		return noSession("sessions reset", key, "reset")
	}
	s := snap.Session
	if s == nil {
		// Pruned: it ended longer ago than sessions.prune.retention. Nothing is left to end.
		fmt.Fprintf(stdout, "session %s of %s ended and was pruned; the key's next message starts a new one\n", snap.Route.SessionID, pasteableKey(key))
		return nil
	}
	if !s.EndedAt.IsZero() {
		fmt.Fprintf(stdout, "session %s of %s already ended (%s)\n", s.ID, pasteableKey(key), s.EndReason)
		return nil
	}
	// Read without their text: a flooded chat's backlog is not held to be dropped. Nothing
	// writes meanwhile: the daemon is not running, or (cluster) the claim fences its members.
	pending, err := st.PendingRefsAfter(ctx, s.ID, 0, math.MaxInt64, 0)
	if err != nil {
		return fmt.Errorf("reset %s: %w", shown, err)
	}
	if len(pending) == 0 && !s.HasSettings() {
		// A session nothing was said in yet (a reset or /new began it, with no message since;
		// notices and an exchange /undo took back are none) and holding no setting of its own
		// (/queue, /title: the session a reset begins has none) is left as it is, as the
		// daemon's reset leaves it (actors' Session.fresh): resetting a key twice ends one
		// session, with or without the daemon.
		said, _, err := st.History(ctx, s.ID, 1)
		if err != nil {
			return fmt.Errorf("reset %s: %w", shown, err)
		}
		continues, err := afterAutomaticReset(ctx, st, s)
		if err != nil {
			return fmt.Errorf("reset %s: %w", shown, err)
		}
		if len(said) == 0 && !continues {
			// "No conversation", not "nothing": sessions show counts its commands and notices
			// among its messages (a new operator's review read the two as contradicting).
			fmt.Fprintf(stdout, "session %s of %s holds no conversation yet (commands and notices do not count): left as it is\n", s.ID, pasteableKey(key))
			return nil
		}
	}
	// The last run's unclean stop, if it stopped so, is not forgotten here (Store.Pardon with no
	// key forgets it): the next start counts it against the head pending message of every other
	// session, and the message that took the daemon down may be any of them. A reset ends one
	// session; the stop's strike against that session's messages falls away by itself, as
	// they are no longer pending.
	now := time.Now().UTC()
	ops := append(fence, &persistence.EndSession{SessionID: s.ID, Reason: persistence.EndResetCommand, At: now})
	ops = append(ops, unansweredOps(key, s, snap.LastOutboxSeq, pending, now)...)
	if errs := st.Commit(ctx, [][]persistence.Op{ops}); len(errs) > 0 && errs[0] != nil {
		return fmt.Errorf("reset %s: %w", shown, errs[0])
	}
	fmt.Fprintf(stdout, "ended session %s of %s (%s)\n", s.ID, pasteableKey(key), persistence.EndResetCommand)
	if n := len(pending); n > 0 {
		// Said as sessions show will show them: failed, no longer pending.
		fmt.Fprintf(stderr, "note: the ended session's %d pending message(s) are marked failed and will not be answered; "+
			"their senders are told so (at the daemon's next start, or a cluster's next recovery)\n", n)
	}
	return nil
}

// unansweredOps settles the pending messages of a session the reset ends, as the daemon's own
// reset does: the daemon never resumes an ended session, so they are marked failed and archived
// (never answered, they are no part of the conversation a /resume of it gives the agent; before,
// failed alone, they came back in its history), and a notice in the outbox, sent by the daemon
// when it next activates the key (its start's recovery, or a cluster's recovery sweep, both of
// which look for undelivered replies), tells their senders to send them again.
func unansweredOps(key string, s *persistence.Session, lastOutboxSeq int64, pending []persistence.Message, now time.Time) []persistence.Op {
	if len(pending) == 0 {
		return nil
	}
	var seqs []int64
	var ids []string
	for _, m := range pending {
		seqs = append(seqs, m.Seq)
		if m.MessageID != "" {
			ids = append(ids, m.MessageID)
		}
	}
	text := actors.OperatorResetNotice(len(pending))
	return []persistence.Op{
		&persistence.SetMessageStatus{SessionID: s.ID, Seqs: seqs, Status: persistence.StatusFailed},
		&persistence.ArchiveMessages{SessionID: s.ID, Seqs: seqs},
		&persistence.AddOutbox{Entry: actors.NewOutboxEntry(key, lastOutboxSeq+1,
			identity.Source{Platform: s.Platform, ChatType: s.ChatType, ChatID: s.ChatID, ThreadID: s.ThreadID, UserID: pending[0].UserID},
			s.ID, platforms.KindNotice, text, "", ids, now)},
	}
}

// searchHelp says what a search query may hold, for a query SQLite's index refuses (PostgreSQL's
// web-search syntax refuses none).
const searchHelp = `words match whole words (all of them), "a phrase" in quotes, prefix* a word's start, ` +
	`and OR and NOT (upper case) combine; quote a word that holds punctuation`

func sessionsSearch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fset := flag.NewFlagSet("sessions search", flag.ContinueOnError)
	var cf configFlags
	cf.registerAdmin(fset, false)
	asJSON := fset.Bool("json", false, "print one JSON array")
	limit := fset.Int("limit", defaultListPage, "at most `N` messages")
	query, err := parseArgs(fset, args, "QUERY", stdout, stderr)
	if err != nil {
		return helpIsDone(err)
	}
	if strings.TrimSpace(query) == "" {
		return usagef("sessions search: the query is empty")
	}
	if *limit < 1 {
		return usagef("sessions search: --limit %d: must be at least 1", *limit)
	}
	st, err := openReader(ctx, &cf, searchTimeout, stderr)
	if err != nil {
		return err
	}
	defer st.Close()
	idx, ok := st.(persistence.Searcher)
	if !ok {
		return fmt.Errorf("sessions search: the %T store has no full-text index", st)
	}
	// A read-only SQLite store indexes nothing: the messages a crash, or a stop that cut the
	// start's catch-up, left above the index's watermark are found only once a daemon has
	// started on the file again. Said, with how many, rather than missed without a word
	// (TestSearchSaysHowFarTheIndexIsBehind).
	var behind int64
	if lite, ok := st.(*sqlite.Store); ok {
		if behind, err = lite.Unindexed(ctx); err != nil {
			return err
		}
		if behind > 0 {
			fmt.Fprintf(stderr, "note: the search index is %d message(s) behind, which this search did not look at: "+
				"a running daemon indexes them within a second, a stopped one when it starts (agentgate serve)\n", behind)
		}
	}
	ms, err := idx.Search(ctx, query, *limit)
	if err != nil {
		if errors.Is(err, sqlite.ErrBadQuery) {
			return usagef("sessions search: %s is not a query the index understands: %s", shortQuote(query), searchHelp)
		}
		return err
	}
	// Name each hit's session key: a message row carries its session id.
	keys := map[string]string{}
	out := make([]searchJSON, 0, len(ms))
	for _, m := range ms {
		key, seen := keys[m.SessionID]
		if !seen {
			s, err := st.Session(ctx, m.SessionID)
			switch {
			case err == nil:
				key = s.Key
			case !errors.Is(err, persistence.ErrNotFound):
				return err
			}
			keys[m.SessionID] = key
		}
		out = append(out, searchJSON{SessionKey: key, messageJSON: messageToJSON(&m)})
	}
	if len(out) == 0 {
		// The note alone, with --json beside its [] too: a header over no rows read as a table
		// whose rows went missing.
		note := ""
		if _, lags := idx.(*sqlite.Store); lags && behind == 0 { // (else the note above says how many)
			note = " (messages of the last second may not be indexed yet)"
		}
		fmt.Fprintln(stderr, "no message matches"+note)
	}
	if *asJSON {
		return writeJSON(stdout, out)
	}
	if len(out) == 0 {
		return nil
	}
	tw := newTable(stdout)
	fmt.Fprintln(tw, "KEY\tSESSION ID\tSEQ\tROLE\tCREATED\tTEXT")
	for _, m := range out {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", keyCell(m.SessionKey), cell(m.SessionID), m.Seq, cell(m.Role),
			timeCell(m.CreatedAt), oneLine(m.Text, showTextRunes))
	}
	return tw.Flush()
}

// sessionsQuarantined lists the quarantined messages of every session, newest first: what an
// operator requeues once the cause is gone (sessions requeue KEY MESSAGE_ID).
func sessionsQuarantined(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fset := flag.NewFlagSet("sessions quarantined", flag.ContinueOnError)
	var cf configFlags
	cf.registerAdmin(fset, false)
	asJSON := fset.Bool("json", false, "print one JSON array")
	limit := fset.Int("limit", defaultListPage, "at most `N` messages")
	if _, err := parseSessionArgs(fset, args, false, stdout, stderr); err != nil {
		return helpIsDone(err)
	}
	if *limit < 1 {
		return usagef("sessions quarantined: --limit %d: must be at least 1", *limit)
	}
	st, err := openReader(ctx, &cf, 0, stderr)
	if err != nil {
		return err
	}
	defer st.Close()
	lister, ok := st.(persistence.QuarantineLister)
	if !ok {
		return fmt.Errorf("sessions quarantined: the %T store cannot list them", st)
	}
	ms, err := lister.Quarantined(ctx, *limit)
	if err != nil {
		return err
	}
	out := make([]quarantinedJSON, 0, len(ms))
	for _, m := range ms {
		out = append(out, quarantinedJSON{SessionKey: m.SessionKey, SessionEnded: m.SessionEnded, messageJSON: messageToJSON(&m.Message)})
	}
	if *asJSON {
		if err := writeJSON(stdout, out); err != nil {
			return err
		}
	} else if len(out) > 0 { // (of none, the note below alone)
		tw := newTable(stdout)
		fmt.Fprintln(tw, "KEY\tMESSAGE ID\tSESSION ID\tSESSION\tUSER\tSENT\tTEXT")
		for _, m := range out {
			state := "open"
			if m.SessionEnded {
				state = "ended"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", keyCell(m.SessionKey), cell(m.MessageID), cell(m.SessionID), state,
				cell(m.UserID), timeCell(m.CreatedAt), oneLine(m.Text, showTextRunes))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	switch {
	case len(out) == 0:
		fmt.Fprintln(stderr, "no message is quarantined")
	case !*asJSON:
		fmt.Fprintln(stderr, "run one again once its cause is gone: agentgate sessions requeue KEY MESSAGE_ID "+
			"(only a message of an open session: an ended one's sender may send it again)")
	}
	if len(out) == *limit {
		fmt.Fprintf(stderr, "more may be quarantined: --limit %d\n", 2**limit)
	}
	return nil
}

// resetCommand is the curl command line that resets key through the running daemon.
func resetCommand(cfg *config.Config, key string) string {
	addr, _, _ := daemonAddr(cfg)
	return resetCommandAt(cfg, addr, key)
}

// resetCommandAt is the curl command line that resets key through the daemon at addr.
func resetCommandAt(cfg *config.Config, addr, key string) string {
	return curlPost(cfg, addr, "/v1/sessions/"+url.PathEscape(key)+"/reset")
}

// lockedPlace is what a running daemon holds, as the admin commands name it, for the error err
// of their open (openStoreWith): the data directory (its own lock, or a SQLite store's) or the
// database (PostgreSQL's lock).
func lockedPlace(cfg *config.Config, err error) string {
	if cfg.Store.Driver == "postgres" && !errors.Is(err, supervisor.ErrDataDirInUse) {
		return "database"
	}
	return "data directory"
}

// curlPost is the curl command line that POSTs to path of the daemon at addr, with the bearer
// token from the variable the config names, if any.
func curlPost(cfg *config.Config, addr, path string) string {
	var auth string
	if cfg.HTTP.TokenEnv != "" {
		auth = fmt.Sprintf(` -H "Authorization: Bearer $%s"`, cfg.HTTP.TokenEnv)
	}
	return fmt.Sprintf("curl -X POST%s http://%s%s", auth, addr, path)
}

// parseSessionArgs parses fset's flags, which may come before and after the KEY argument when
// wantKey. It returns flag.ErrHelp after -h and errUsage after a usage error.
func parseSessionArgs(fset *flag.FlagSet, args []string, wantKey bool, stdout, stderr io.Writer) (string, error) {
	if !wantKey {
		return parseArgs(fset, args, "", stdout, stderr)
	}
	arg, err := parseArgs(fset, args, "KEY", stdout, stderr)
	if err != nil {
		return "", err
	}
	return parseKey(fset.Name(), arg)
}

// parseKey returns the session key a KEY argument of command cmd names (keyArg), or a
// *usageError that says why it names none.
func parseKey(cmd, arg string) (string, error) {
	key, badQuote := keyArg(arg)
	if _, err := identity.ParseKey(key); err != nil {
		if badQuote != nil {
			return "", usagef("%s: %s begins with a quote but is not Go-quoted as sessions list prints a key (%v), and no key begins with one",
				cmd, shortQuote(arg), badQuote)
		}
		if errors.Is(err, identity.ErrBadKey) {
			// (Its error quotes the key whole: a 100 KB one filled the terminal.)
			err = fmt.Errorf("%w: %s", identity.ErrBadKey, shortQuote(key))
		}
		return "", usagef("%s: %v (want agent:<profile>:<platform>:<chat type>:<chat id>[:...], as printed by sessions list)", cmd, err)
	}
	return key, nil
}

// keyArg is the session key an argument names, as the sessions commands read a KEY and list's
// --after: the key a Go-quoted argument stands for, as pasteableKey prints one and the shell
// hands it on, else the argument itself, raw. An argument is quoted when it begins with " and is
// one whole Go string literal; every key begins with "agent:", so no key reads both ways.
// badQuote says why an argument that begins with " is no Go string literal: it is returned raw,
// but names no key.
func keyArg(arg string) (key string, badQuote error) {
	if !strings.HasPrefix(arg, `"`) {
		return arg, nil
	}
	k, err := strconv.Unquote(arg)
	if err != nil {
		return arg, err
	}
	return k, nil
}

// parseArgs parses fset's flags and, when name is not empty, the one argument it names, with
// flags before and after it. It returns flag.ErrHelp after -h and errUsage after a usage error
// (parseFlags).
func parseArgs(fset *flag.FlagSet, args []string, name string, stdout, stderr io.Writer) (string, error) {
	if err := parseUsage(fset, args, stdout, stderr); err != nil {
		return "", err
	}
	if name != "" && fset.NArg() == 0 {
		fmt.Fprintf(stderr, "agentgate %s: missing %s (agentgate %[1]s -h says what it is)\n", fset.Name(), name)
		return "", errUsage
	}
	return restArg(fset, name != "", stdout, stderr)
}

// parseOptionalArg is parseArgs of at most one argument, which may be missing.
func parseOptionalArg(fset *flag.FlagSet, args []string, stdout, stderr io.Writer) (string, error) {
	if err := parseUsage(fset, args, stdout, stderr); err != nil {
		return "", err
	}
	return restArg(fset, fset.NArg() > 0, stdout, stderr)
}

// restArg takes the argument parseUsage left first when there is one, parses the flags after
// it, and refuses any other argument.
func restArg(fset *flag.FlagSet, one bool, stdout, stderr io.Writer) (string, error) {
	var arg string
	if one {
		arg = fset.Arg(0)
		if err := parseUsage(fset, fset.Args()[1:], stdout, stderr); err != nil {
			return "", err
		}
	}
	if fset.NArg() > 0 {
		unexpectedArg(stderr, fset)
		return "", errUsage
	}
	return arg, nil
}

// parseUsage is parseFlags that returns flag.ErrHelp after -h and errUsage after a usage error.
func parseUsage(fset *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	err := parseFlags(fset, args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return flag.ErrHelp
	}
	if err != nil {
		return errUsage
	}
	return nil
}

// helpIsDone turns the help request of parseSessionArgs into success.
func helpIsDone(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// searchTimeout bounds a search on PostgreSQL, which scans the messages (about 16 µs each
// without README's index): the store's default 15 s would fail it at about a million. Ctrl-C
// still ends it at once.
const searchTimeout = 30 * time.Minute

// noDatabaseHint ends the error of a command that finds no SQLite database: an operator whose
// daemon runs on PostgreSQL, configured by its environment, ran the command without it.
const noDatabaseHint = "check --data-dir and --config; for a daemon on PostgreSQL, give the command its store settings too: " +
	"its --config, or AGENTGATE_STORE_DRIVER=postgres and AGENTGATE_STORE_DSN, with PGPASSWORD"

// openReader opens the store read-only (openStoreWith), for a command that shows what the
// database holds: when writes wait in the spool (the daemon spools while the database refuses
// writes, and a daemon killed with -9 leaves them there until its next start), it says on
// stderr that what it shows lacks them. Before, show, list and export showed the stale state
// without a word (a walkthrough).
func openReader(ctx context.Context, cf *configFlags, timeout time.Duration, stderr io.Writer) (persistence.Store, error) {
	st, cfg, _, err := openStoreWith(ctx, cf, storeReadOnly, timeout)
	if err != nil {
		return nil, err
	}
	noteSpooled(cf.fs.Name(), cfg, stderr)
	return st, nil
}

// noteSpooled writes a note on stderr when the spool of cfg's data_dir holds writes the
// database does not have yet, and a warning when the command cmd cannot tell (spoolUnread).
func noteSpooled(cmd string, cfg *config.Config, stderr io.Writer) {
	if cfg.Cluster.Enabled {
		return // (a cluster keeps no spool)
	}
	dir := filepath.Join(cfg.DataDir, "spool")
	if n, err := spool.Waiting(dir); err != nil {
		fmt.Fprintf(stderr, "warning: %s\n", spoolUnread(cmd, cfg, err, "what this prints"))
	} else if n > 0 {
		fmt.Fprintf(stderr, "note: %s holds %d batch(es) of writes the database does not have yet, so this lacks them; "+
			"the daemon writes them once the database takes writes again (a stopped daemon, when it starts)\n", dir, n)
	}
}

// spoolUnread is the warning of the command cmd that could not read the spool of cfg's data_dir
// (err): what, its output, may lack writes still waiting there, and, when this user may not
// read it, which path stops it, whose it is and what to do (denied). Before, it was the raw
// "could not read …/spool: spool: open …/spool: permission denied", which said neither what it
// meant for the output nor what to do (a CLI review).
func spoolUnread(cmd string, cfg *config.Config, err error, what string) string {
	dir := filepath.Join(cfg.DataDir, "spool")
	head := what + " may lack writes still waiting in the spool, which the database does not have yet"
	if d := denied(cmd, "the spool directory "+dir, cfg.DataDir, err, false); d != nil {
		return head + ": " + d.Error()
	}
	return fmt.Sprintf("%s: could not read the spool directory %s (%v)", head, dir, err)
}

// databasePlace names where cfg's SQLite database is, as an error that this user may not use it
// says: its data directory, or the database file when store.dsn puts it elsewhere.
func databasePlace(cfg *config.Config) string {
	if path := cfg.DSN(); filepath.Dir(path) != filepath.Clean(cfg.DataDir) {
		return "the database " + path
	}
	return "the data directory " + cfg.DataDir
}

// mayOpen returns the error of the admin command cmd (denied) when this user may not open the
// SQLite database at path, to read it, or to write it: a copy a restore left root's, in a data
// directory this user may use. SQLite says only "unable to open database file (14)", with the
// files it could not open.
func mayOpen(cmd string, cfg *config.Config, path string, write bool) error {
	flag := os.O_RDONLY
	if write {
		flag = os.O_RDWR
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return denied(cmd, databasePlace(cfg), cfg.DataDir, err, write)
	}
	return f.Close()
}

// storeAccess is how an admin command opens the store.
type storeAccess int

const (
	storeReadOnly storeAccess = iota // alongside the daemon
	storeWrite                       // alone, or as one more of a cluster's members; a single daemon's data directory too
	storeAlone                       // alone, also in a cluster: no member may run; a single daemon's data directory too
)

// openStoreWith loads the configuration and opens its database with access: read-only, or with
// the write lock (which a running daemon holds): a SQLite file (it never creates one) or
// PostgreSQL (whose daemon lock is an advisory lock), whose calls may take up to timeout (0: the
// store's default). It never migrates (an upgrade is the daemon's): a database whose schema is
// older than this binary's is refused. The config is returned whenever it loaded, even on error.
//
// A writing command (storeWrite, storeAlone) on a single daemon's configuration takes the data
// directory's lock (supervisor.LockDataDir) before the store's, as a daemon takes them, and gets
// it back (to close after the store; nil otherwise): a daemon that is starting holds the first
// before it opens the store, and a command that took only the store's lock acted on the store
// under it (and could fail its start). Held by another process, it is refused as the store's
// lock is (persistence.ErrLocked, and supervisor.ErrDataDirInUse), so a command that goes
// through the running daemon then still does. The lock is taken after the check that the
// SQLite database exists, so that a command refused for a wrong --data-dir creates nothing
// there. Cluster members take no lock on their data directory, and a reader none either.
func openStoreWith(ctx context.Context, cf *configFlags, access storeAccess, timeout time.Duration) (persistence.Store, *config.Config, io.Closer, error) {
	readOnly := access == storeReadOnly
	// What pgx refuses on this machine, in its words, with the file or the PG* variable named
	// and the file's line of the key, as serve refuses it: the store's Open says only that the
	// DSN cannot be parsed (before, without the line: found by a new user's walkthrough).
	// A data_dir that is no directory (--data-dir data/agentgate.db) is said to be one, once for
	// every command, rather than in the words of what failed on it.
	cfg, problems, refused := cf.check(func(c *config.Config) []error { return nonNil(notADirectory(c.DataDir), c.CheckPostgres()) })
	if problems != nil {
		return nil, nil, nil, configError(problems)
	}
	if refused != nil {
		return nil, cfg, nil, refused
	}
	var dirLock io.Closer
	lockDir := func() error {
		if access == storeReadOnly || cfg.Cluster.Enabled {
			return nil // (cluster members take no lock on their data directory)
		}
		f, err := supervisor.LockDataDir(cfg.DataDir, cf.fs.Name()) // ("sessions pardon": what its refusals name)
		var inUse *supervisor.DataDirInUse
		switch {
		case err == nil:
			dirLock = f
		case errors.As(err, &inUse) && inUse.ByCommand():
			// Not ErrLocked: no daemon runs to go through or to stop (before, a pardon said to
			// stop the daemon, and a reset looked for one to ask).
			return fmt.Errorf("%s: another admin command holds the data directory %s (agentgate %s, pid %d); run this one again once it is done",
				cf.fs.Name(), cfg.DataDir, inUse.Holder, inUse.PID)
		case errors.Is(err, syscall.EROFS):
			// What to do, as serve says it of the same mount: before, only "data directory …:
			// lock: open …/agentgate-dir.flock: read-only file system" (a CLI review).
			return fmt.Errorf("%s: the data directory %s is on a read-only file system, and this command writes there (its lock, and the database): "+
				"mount it writable (list, show, export, search and quarantined only read it)", cf.fs.Name(), cfg.DataDir)
		}
		if d := denied(cf.fs.Name(), "the data directory "+cfg.DataDir, cfg.DataDir, err, true); d != nil {
			return d
		}
		return err
	}
	closeDir := func() {
		if dirLock != nil {
			dirLock.Close()
		}
	}
	if cfg.Store.Driver == "postgres" {
		// Only a data directory that is there: a daemon on this host makes it before it opens
		// the store, and a command run on another host (the database is shared) must not make
		// one where it stands; no daemon there can hold its lock.
		if _, err := os.Stat(cfg.DataDir); err == nil {
			if err := lockDir(); err != nil {
				return nil, cfg, nil, err
			}
		}
		// A cluster's members hold the daemon lock shared: a writing tool of the cluster joins
		// them (and is kept off while a single daemon runs), a single daemon's takes it alone.
		member := access == storeWrite && cfg.Cluster.Enabled
		st, err := postgres.Open(ctx, cfg.Store.DSN, postgres.Options{MaxConns: 2, Exclusive: !readOnly && !member, Shared: member, NoMigrate: true, Timeout: timeout})
		if err != nil {
			closeDir()
			return nil, cfg, nil, err
		}
		return st, cfg, dirLock, nil
	}
	path := cfg.DSN()
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, cfg, nil, fmt.Errorf("no database at %s (%s)", path, noDatabaseHint)
	} else if d := denied(cf.fs.Name(), databasePlace(cfg), cfg.DataDir, err, false); d != nil {
		return nil, cfg, nil, d
	}
	if err := lockDir(); err != nil {
		return nil, cfg, nil, err
	}
	if err := mayOpen(cf.fs.Name(), cfg, path, !readOnly); err != nil {
		closeDir()
		return nil, cfg, nil, err
	}
	var st *sqlite.Store
	var err error
	if readOnly {
		st, err = sqlite.OpenReadOnly(ctx, path)
	} else {
		// NoMigrate, as on PostgreSQL: an upgrade is one way, and only the daemon makes it.
		// MustWrite: a database locked by another process fails the open in 5 s, saying so,
		// instead of in 15 to 20 s of writes that each wait for it.
		st, err = sqlite.Open(ctx, path, sqlite.Options{Synchronous: cfg.Store.Synchronous, NoMigrate: true, MustWrite: true})
	}
	if err != nil {
		closeDir()
		return nil, cfg, nil, err
	}
	return st, cfg, dirLock, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// cell makes an untrusted value safe for one table cell: one line, no control characters, "-"
// when empty.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	return oneLine(s, 0)
}

// oneLine renders text on one line: line breaks become ⏎, tabs spaces, and other control
// characters and the invisible format characters U+FFFD: so nothing reaches the terminal as an
// escape sequence, and no right-to-left override (U+202E), isolate (U+2066…U+2069), zero-width
// space or byte order mark reorders or hides what an operator reads. The zero-width joiner,
// which only joins emoji, is kept. A positive limit keeps the first limit runes and marks the
// cut with "…".
func oneLine(s string, limit int) string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	var b strings.Builder
	n := 0
	for _, r := range s {
		if limit > 0 && n == limit {
			b.WriteString("…")
			break
		}
		switch {
		case r == '\n' || r == '\r' || r == '\u2028' || r == '\u2029':
			r = '⏎'
		case r == '\t':
			r = ' '
		case unicode.IsControl(r), unicode.Is(unicode.Cf, r) && r != '\u200d':
			r = unicode.ReplacementChar
		}
		b.WriteRune(r)
		n++
	}
	return b.String()
}

// tablePadding is the number of spaces between two columns of a table.
const tablePadding = 2

// table lays out the text tables of the sessions commands as text/tabwriter does (with no
// minimal width, a padding of tablePadding spaces and no flags): cells end with a tab, a line's
// last cell is not aligned, and a column is aligned over each run of consecutive lines that
// hold a cell in it. Unlike tabwriter, which counts runes, it measures a cell in the columns a
// terminal gives it (uniseg.StringWidth, by grapheme cluster): a CJK character or an emoji
// takes two, a combining mark or an emoji's joiner none, so that a wide character in a key,
// id or name no longer shifts the columns after it. An ASCII table is laid out byte for byte
// as tabwriter lays it out.
//
// The cells written to it must be neutralised already (cell, oneLine): what is measured must
// be what the terminal shows, a U+FFFD one column wide, not the invisible format character it
// stands for, which uniseg counts as none.
type table struct {
	w   io.Writer
	buf strings.Builder
	// sticky keeps each column at least as wide as at the last Flush, for a table of lines of
	// one shape printed in parts (sessions list's pages).
	sticky bool
	widths []int
}

func newTable(w io.Writer) *table { return &table{w: w} }

// Write buffers p: nothing is written before Flush, which knows every column's width.
func (t *table) Write(p []byte) (int, error) { return t.buf.Write(p) }

// Flush writes the buffered lines out, aligned, and empties the table.
func (t *table) Flush() error {
	text := t.buf.String()
	t.buf.Reset()
	if text == "" {
		return nil
	}
	// A last line without a newline is written without one, as tabwriter writes it.
	rows := strings.Split(text, "\n")
	newline := len(rows) - 1 // the number of lines that end with one
	if rows[newline] == "" {
		rows = rows[:newline]
	}
	lines := make([][]string, len(rows))
	widths := make([][]int, len(rows))
	for i, r := range rows {
		lines[i] = strings.Split(r, "\t")
		widths[i] = make([]int, len(lines[i])-1)
	}
	alignColumn(lines, widths, 0)
	if t.sticky {
		for _, w := range widths {
			for j := range w {
				if j == len(t.widths) {
					t.widths = append(t.widths, 0)
				}
				t.widths[j] = max(t.widths[j], w[j])
			}
		}
		for _, w := range widths {
			copy(w, t.widths)
		}
	}
	var b strings.Builder
	for i, cells := range lines {
		for j, c := range cells {
			b.WriteString(c)
			if j < len(widths[i]) {
				b.WriteString(strings.Repeat(" ", widths[i][j]-uniseg.StringWidth(c)))
			}
		}
		if i < newline {
			b.WriteByte('\n')
		}
	}
	_, err := io.WriteString(t.w, b.String())
	return err
}

// alignColumn sets the width of column col in lines, and then of the columns right of it, as
// tabwriter does: over each run of consecutive lines with a tab-terminated cell in col, the
// widest cell plus the padding. A line without such a cell ends the run.
func alignColumn(lines [][]string, widths [][]int, col int) {
	for i := 0; i < len(lines); {
		if col >= len(widths[i]) {
			i++
			continue
		}
		end, width := i, 0
		for ; end < len(lines) && col < len(widths[end]); end++ {
			width = max(width, uniseg.StringWidth(lines[end][col])+tablePadding)
		}
		for k := i; k < end; k++ {
			widths[k][col] = width
		}
		alignColumn(lines[i:end], widths[i:end], col+1)
		i = end
	}
}

// pasteableKey is key as the sessions commands print it, to be pasted as a KEY argument or
// after list's --after: raw when it is one plain shell word, else Go-quoted inside single
// quotes ('"agent:…\u202e…"'), which the shell passes on as it is and keyArg unquotes. Raw, a
// key's right-to-left override or C1 control (identity.Escape encodes only the ASCII ones)
// would reach the terminal, to reorder what is shown or start an escape sequence, and a space
// or quote would break the pasted argument. A single quote is written \x27, which leaves the shell's quotes closed.
func pasteableKey(key string) string {
	plain := utf8.ValidString(key)
	for _, r := range key {
		if r < utf8.RuneSelf && !unicode.IsLetter(r) && !unicode.IsDigit(r) && !strings.ContainsRune("-_.:/%@+=,", r) ||
			!strconv.IsPrint(r) {
			plain = false
			break
		}
	}
	if plain {
		return key
	}
	return "'" + strings.ReplaceAll(strconv.Quote(key), "'", `\x27`) + "'"
}

// keyCell is a session key, or an id it is made of, as the text output shows it:
// pasteableKey's form, which an operator can paste as a KEY argument (cell's U+FFFD for a
// character that does not display could not be), or "-" for none.
func keyCell(key string) string {
	if key == "" {
		return "-"
	}
	return pasteableKey(key)
}

// errArgBytes is how much of an argument an error that refuses it repeats: a KEY pasted with a
// log line, or a file's contents, may be of any length, and before, "session … not found" echoed
// a 100 KB one whole (found by a CLI review). A key the platforms make is far shorter than
// that, whole, wherever a command names a key that a session has.
const errArgBytes = 200

// noSession is the error of the admin command cmd ("sessions show") given a KEY no session has
// (a typo, a key of another deployment); undone, of a command that changes something, is what
// it did not do ("reset"). It names the key as a key, and the command that prints the keys.
// Before, "session KEY not found" called the key a session, and requeue printed the daemon's
// raw "no such session (not_found)" (a CLI review).
func noSession(cmd, key, undone string) error {
	if undone != "" {
		undone = ", so nothing was " + undone
	}
	return fmt.Errorf("%s: the key %s has no session%s; agentgate sessions list prints the keys that have one", cmd, shortKey(key), undone)
}

// errNoSession is a daemon's refusal of a KEY no session has (404 no_session; an older daemon's
// 404 not_found "no such session": daemonAnswer.noSession).
var errNoSession = errors.New("no such session")

// shortKey is key as an error that refuses it names it: pasteableKey's form of its first
// errArgBytes bytes (whole runes), then "…" and its length when it is longer.
func shortKey(key string) string {
	if len(key) <= errArgBytes {
		return pasteableKey(key)
	}
	return pasteableKey(head(key)) + fmt.Sprintf("… (%d bytes)", len(key))
}

// shortQuote is s Go-quoted, as an error that refuses it names it: at most its first
// errArgBytes bytes, as shortKey.
func shortQuote(s string) string {
	if len(s) <= errArgBytes {
		return strconv.Quote(s)
	}
	return strconv.Quote(head(s)) + fmt.Sprintf("… (%d bytes)", len(s))
}

// shortArg is s as is, as an error names an id it refuses: at most its first errArgBytes
// bytes, as shortKey.
func shortArg(s string) string {
	if len(s) <= errArgBytes {
		return s
	}
	return head(s) + fmt.Sprintf("… (%d bytes)", len(s))
}

// head is s's first errArgBytes bytes, fewer to end at a rune's start.
func head(s string) string {
	n := min(len(s), errArgBytes)
	for n > 0 && n < len(s) && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// timeCell is t in RFC 3339 UTC, or "-" for the zero time.
func timeCell(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// ended is the ENDED column: the end reason, or "open".
func ended(s *persistence.Session) string {
	switch {
	case s.EndedAt.IsZero():
		return "open"
	case s.EndReason == "":
		return "ended"
	}
	return cell(s.EndReason)
}

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC()
}

// The JSON forms below are the command's output contract: snake_case names that do not follow
// the Go field names of the persistence rows.

type sessionJSON struct {
	ID             string    `json:"id"`
	SessionKey     string    `json:"session_key"`
	Platform       string    `json:"platform"`
	ChatType       string    `json:"chat_type"`
	ChatID         string    `json:"chat_id"`
	ThreadID       string    `json:"thread_id"`
	UserID         string    `json:"user_id"`
	UserName       string    `json:"user_name"`
	ScopeID        string    `json:"scope_id"`
	Profile        string    `json:"profile"`
	Title          string    `json:"title"`
	Epoch          int64     `json:"epoch"`
	StartedAt      time.Time `json:"started_at,omitzero"`
	LastActivityAt time.Time `json:"last_activity_at,omitzero"`
	EndedAt        time.Time `json:"ended_at,omitzero"`
	EndReason      string    `json:"end_reason,omitempty"`
	PrevSessionID  string    `json:"prev_session_id,omitempty"`
	InputTokens    int64     `json:"input_tokens"`
	OutputTokens   int64     `json:"output_tokens"`
	// ResetDueReason and ResetDueAt are the reset that fell due while the open session worked
	// (persistence.MarkResetDue), done once its work is; absent when none is.
	ResetDueReason string    `json:"reset_due_reason,omitempty"`
	ResetDueAt     time.Time `json:"reset_due_at,omitzero"`
}

// searchJSON is one hit of search: the message and its session's key.
type quarantinedJSON struct {
	SessionKey   string `json:"session_key"`
	SessionEnded bool   `json:"session_ended"`
	messageJSON
}

type searchJSON struct {
	SessionKey string `json:"session_key"`
	messageJSON
}

type messageJSON struct {
	SessionID string    `json:"session_id"`
	Seq       int64     `json:"seq"`
	Role      string    `json:"role"`
	Text      string    `json:"text"`
	Platform  string    `json:"platform"`
	ChatID    string    `json:"chat_id"`
	MessageID string    `json:"message_id"`
	UserID    string    `json:"user_id"`
	UserName  string    `json:"user_name"`
	TurnID    string    `json:"turn_id"`
	Status    string    `json:"status"`
	Active    bool      `json:"active"`
	Archived  bool      `json:"archived"`
	Attempts  int       `json:"attempts"`
	CreatedAt time.Time `json:"created_at,omitzero"`
}

type outboxJSON struct {
	SessionKey  string    `json:"session_key"`
	Seq         int64     `json:"seq"`
	SessionID   string    `json:"session_id"`
	Kind        string    `json:"kind"`
	Text        string    `json:"text"`
	TurnID      string    `json:"turn_id"`
	InReplyTo   []string  `json:"in_reply_to"`
	Platform    string    `json:"platform"`
	ChatType    string    `json:"chat_type"`
	ChatID      string    `json:"chat_id"`
	ThreadID    string    `json:"thread_id"`
	UserID      string    `json:"user_id"`
	State       string    `json:"state"`
	Attempts    int       `json:"attempts"`
	CreatedAt   time.Time `json:"created_at,omitzero"`
	DeliveredAt time.Time `json:"delivered_at,omitzero"`
}

type routeJSON struct {
	SessionKey string    `json:"session_key"`
	SessionID  string    `json:"session_id"`
	Generation int64     `json:"generation"`
	UpdatedAt  time.Time `json:"updated_at,omitzero"`
}

type listJSON struct {
	Session  sessionJSON `json:"session"`
	Messages int         `json:"messages"`
	Pending  int         `json:"pending"`
}

type showJSON struct {
	SessionKey string    `json:"session_key"`
	Route      routeJSON `json:"route"`
	// Claim is the key's owner row (Store.Ownership): the cluster member whose activation runs
	// the key, or ran it last; absent when no member ever claimed it (a single daemon's key).
	Claim   *claimJSON   `json:"claim,omitempty"`
	Session *sessionJSON `json:"session"` // null when the routed row is missing
	Counts  struct {
		Messages int `json:"messages"` // every row, archived ones included
		Pending  int `json:"pending"`
		// Failed counts the user messages that will not be answered: their turn failed, or a
		// reset or a command dropped them (before, a reset's note called them pending, and show
		// counted them nowhere: found by an operations walkthrough).
		Failed   int `json:"failed"`
		Archived int `json:"archived"`
	} `json:"counts"`
	Outbox outboxCountsJSON `json:"outbox"`
	Last   []messageJSON    `json:"last_messages"`
}

type claimJSON struct {
	Owner     string    `json:"owner"`
	Epoch     int64     `json:"epoch"`
	ClaimedAt time.Time `json:"claimed_at,omitzero"`
}

type outboxCountsJSON struct {
	LastSeq     int64 `json:"last_seq"`
	Undelivered int   `json:"undelivered"`
}

type exportJSON struct {
	SessionKey string              `json:"session_key"`
	ExportedAt time.Time           `json:"exported_at"`
	Sessions   []exportSessionJSON `json:"sessions"` // newest first
	Outbox     []outboxJSON        `json:"outbox"`
}

type exportSessionJSON struct {
	Session  sessionJSON   `json:"session"`
	Messages []messageJSON `json:"messages"`
}

func sessionToJSON(s *persistence.Session) sessionJSON {
	return sessionJSON{
		ID: s.ID, SessionKey: s.Key, Platform: s.Platform, ChatType: s.ChatType, ChatID: s.ChatID,
		ThreadID: s.ThreadID, UserID: s.UserID, UserName: s.UserName, ScopeID: s.ScopeID,
		Profile: s.Profile, Title: s.Title, Epoch: s.Epoch, StartedAt: utc(s.StartedAt),
		LastActivityAt: utc(s.LastActivityAt), EndedAt: utc(s.EndedAt), EndReason: s.EndReason,
		PrevSessionID: s.PrevSessionID, InputTokens: s.InputTokens, OutputTokens: s.OutputTokens,
		ResetDueReason: s.ResetDueReason, ResetDueAt: utc(s.ResetDueAt),
	}
}

func messageToJSON(m *persistence.Message) messageJSON {
	return messageJSON{
		SessionID: m.SessionID, Seq: m.Seq, Role: m.Role, Text: m.Content, Platform: m.Platform,
		ChatID: m.ChatID, MessageID: m.MessageID, UserID: m.UserID, UserName: m.UserName,
		TurnID: m.TurnID, Status: m.Status, Active: m.Active, Archived: m.Archived,
		Attempts: m.Attempts, CreatedAt: utc(m.CreatedAt),
	}
}

func outboxToJSON(e *persistence.OutboxEntry) outboxJSON {
	in := e.InReplyTo
	if in == nil {
		in = []string{}
	}
	return outboxJSON{
		SessionKey: e.SessionKey, Seq: e.Seq, SessionID: e.SessionID, Kind: e.Kind, Text: e.Text,
		TurnID: e.TurnID, InReplyTo: in, Platform: e.Platform, ChatType: e.ChatType,
		ChatID: e.ChatID, ThreadID: e.ThreadID, UserID: e.UserID, State: e.State,
		Attempts: e.Attempts, CreatedAt: utc(e.CreatedAt), DeliveredAt: utc(e.DeliveredAt),
	}
}

// afterAutomaticReset reports whether s succeeded a session that ended by itself (idle, daily,
// suspended): its first turn is told to continue that one (the actors' continuity note), so a
// reset of it is no no-op even when nothing was said in it yet.
func afterAutomaticReset(ctx context.Context, st persistence.Store, s *persistence.Session) (bool, error) {
	if s.PrevSessionID == "" {
		return false, nil
	}
	prev, err := st.Session(ctx, s.PrevSessionID)
	if errors.Is(err, persistence.ErrNotFound) {
		return false, nil // pruned: no note names it
	}
	if err != nil {
		return false, err
	}
	switch prev.EndReason {
	case persistence.EndIdle, persistence.EndDaily, persistence.EndSuspended:
		return true, nil
	}
	return false, nil
}
