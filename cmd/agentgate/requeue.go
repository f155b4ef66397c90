package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// `agentgate sessions requeue KEY MESSAGE_ID` has the daemon run a quarantined message again
// (POST /v1/sessions/{key}/messages/{id}/requeue). Only a running daemon (or cluster member)
// requeues: the session that owns the message queues it behind the messages already waiting
// and runs it, so the command goes through its HTTP API as `sessions reset` does. With no
// daemon running it refuses and changes nothing: a message set pending in the store would run
// only at the next start, and then as recovered work (answered with a notice, not run, under
// sessions.recovery: notice), which is not what was asked.

// sessionsRequeue runs `agentgate sessions requeue KEY MESSAGE_ID`.
func sessionsRequeue(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fset := flag.NewFlagSet("sessions requeue", flag.ContinueOnError)
	var cf configFlags
	cf.registerAdmin(fset, true)
	asJSON := fset.Bool("json", false, "print one JSON object")
	key, id, err := parseKeyAndMessage(fset, args, stdout, stderr)
	if err != nil {
		return helpIsDone(err)
	}
	// The data directory's lock first, as a daemon takes it (openStoreWith): a daemon that is
	// starting holds it before it opens the store. Before, the requeue took only the store's
	// lock then (which could fail the daemon's start), and said that no daemon runs; now it goes
	// the way of a running daemon's.
	st, cfg, dirLock, err := openStoreWith(ctx, &cf, storeWrite, 0)
	if errors.Is(err, persistence.ErrLocked) {
		where := lockedPlace(cfg, err)
		addr, run, recorded := daemonAddr(cfg)
		if !recorded {
			return fmt.Errorf("the daemon is running on this %s, but it records no address in %s (it starts, or it runs on another host); requeue through it: %s",
				where, cfg.DataDir, requeueCommand(cfg, addr, key, id))
		}
		res, err := daemonRequeue(ctx, cfg, addr, run, key, id)
		switch {
		case isNotTheDaemon(err):
			return fmt.Errorf("the daemon is running on this %s, but %v; requeue through it where it listens (its log says: listening on ADDRESS): %s",
				where, err, requeueCommand(cfg, "ADDRESS", key, id))
		case errors.Is(err, errNoAnswer):
			return fmt.Errorf("the daemon is running on this %s, but %v; requeue through it when it answers: %s", where, err, requeueCommand(cfg, addr, key, id))
		case errors.Is(err, errAnswerLost):
			return requeueAnswerLost(key, id, err)
		case errors.Is(err, errStopping):
			return fmt.Errorf("requeue %s of %s: %v; run it again once the daemon has restarted", shortArg(id), shortKey(key), err)
		case err != nil:
			return requeueRefused(key, id, err)
		}
		return printRequeue(stdout, daemonNoun(cfg), addr, res, *asJSON)
	}
	if err != nil {
		return err
	}
	if dirLock != nil {
		defer dirLock.Close() // (after the store's: deferred calls run last in, first out)
	}
	defer st.Close()
	if cfg.Cluster.Enabled {
		done, silent, err := throughMember(ctx, st, cfg, func(addr, run string) error {
			res, err := daemonRequeue(ctx, cfg, addr, run, key, id)
			switch {
			case errors.Is(err, errNoAnswer) || isNotTheDaemon(err) || errors.Is(err, errStopping) || isRouteUnknown(err):
				return err // the next member is asked (a stopping one, or one without the route, changed nothing)
			case errors.Is(err, errAnswerLost):
				return requeueAnswerLost(key, id, err)
			case err != nil:
				return requeueRefused(key, id, err)
			}
			return printRequeue(stdout, daemonNoun(cfg), addr, res, *asJSON)
		})
		if isRouteUnknown(err) {
			return requeueRefused(key, id, err) // (every member that answered is older than the command)
		}
		if done || err != nil {
			return err
		}
		if len(silent) == 0 {
			return fmt.Errorf("requeue %s of %s: no cluster member runs (none is registered in the database); a requeue runs the message, which only a running member does: start one and try again (nothing was changed)",
				shortArg(id), shortKey(key))
		}
		return fmt.Errorf("requeue %s of %s: no cluster member answered (%s); a requeue runs the message, which only a running member does: start one and try again (nothing was changed)",
			shortArg(id), shortKey(key), strings.Join(silent, "; "))
	}
	// What the store shows of the message may lack writes waiting in the spool (its quarantine,
	// or its requeue through the daemon): the start replays them before any session loads, so the
	// requeue through it acts on them too. Said here, as the readers say it.
	spooled := ""
	if n, err := spool.Waiting(filepath.Join(cfg.DataDir, "spool")); err == nil && n > 0 {
		spooled = fmt.Sprintf("; at its start it first replays the %d batch(es) of writes waiting in %s, which the database does not have yet "+
			"(sessions quarantined and show lack them)", n, filepath.Join(cfg.DataDir, "spool"))
	}
	return fmt.Errorf("requeue %s of %s: no daemon runs on %s; a requeue runs the message, which only the daemon does: start it (agentgate serve) and try again%s (nothing was changed)",
		shortArg(id), shortKey(key), cfg.DataDir, spooled)
}

// daemonRequeue asks the daemon listening at addr, run run, to requeue message id of key
// (daemonPost), and returns its answer. A refusal (404, 409) is an error with its message:
// errNoSession, a *noMessageError or a *requeueRefusal.
func daemonRequeue(ctx context.Context, cfg *config.Config, addr, run, key, id string) (*httpplatform.MessageResponse, error) {
	a, err := daemonPost(ctx, cfg, addr, run, requeuePath(key, id), "requeue")
	if err != nil {
		return nil, err
	}
	switch a.status {
	case http.StatusOK, http.StatusAccepted:
		var res httpplatform.MessageResponse
		if err := json.Unmarshal(a.body, &res); err != nil || res.SessionKey != key || res.MessageID != id {
			return nil, fmt.Errorf("the %[1]s at %[2]s answered %[3]s without the requeue of %[4]s: is this the %[1]s's address?", daemonNoun(cfg), addr, a.statusText, shortArg(id))
		}
		return &res, nil
	case http.StatusNotFound, http.StatusConflict:
		switch {
		case a.noSession(), a.code == httpplatform.CodeNotFound && strings.HasSuffix(a.raw, ": it holds no stored session"):
			// The second is an older daemon's answer (one still running during a rolling
			// upgrade) for a key that routes to no stored session (it was pruned): a key
			// with no session, as its GET says, not a message the key lacks.
			return nil, errNoSession
		case a.code == httpplatform.CodeNotFound:
			return nil, &noMessageError{a.msg}
		case a.code != "":
			return nil, &requeueRefusal{code: a.code, msg: a.msg}
		}
	}
	return nil, fmt.Errorf("the %s at %s answered %s: %s", daemonNoun(cfg), addr, a.statusText, a.msg)
}

// noMessageError is a daemon's refusal of a requeue of a message its key does not have (404
// not_found), with the daemon's message: the key and the session it looked in.
type noMessageError struct{ msg string }

func (e *noMessageError) Error() string { return e.msg }

// requeueRefusal is a daemon's refusal of a requeue (409) with its code (not_quarantined,
// session_ended) and message.
type requeueRefusal struct{ code, msg string }

func (e *requeueRefusal) Error() string { return fmt.Sprintf("%s (%s)", e.msg, e.code) }

// requeueRefused is the error of a requeue of message id of key the daemon refused (err). A key
// no session has, a message the key does not have, and a message that is not quarantined or
// whose session has ended are said for an operator: the daemon's reason, and the command that
// shows what there is. Before, they were the daemon's raw "no such session (not_found)" and
// "no message ID in session KEY (not_found)", which called the key a session (a CLI review),
// and its reason with the code after it, "… (not_quarantined)", "… (session_ended)", which said
// nothing of what to do (a CLI review). A code this command does not know (a newer daemon's) is
// still shown as it comes.
func requeueRefused(key, id string, err error) error {
	if errors.Is(err, errNoSession) {
		return noSession("sessions requeue", key, "requeued")
	}
	show := "agentgate sessions show KEY"
	if len(key) <= errArgBytes {
		show = "agentgate sessions show " + pasteableKey(key)
	}
	if nm, ok := errors.AsType[*noMessageError](err); ok {
		return fmt.Errorf("sessions requeue: %s, so nothing was requeued; %s lists the key's last messages with their ids, "+
			"agentgate sessions quarantined the quarantined ones, which a requeue runs", nm.msg, show)
	}
	if rr, ok := errors.AsType[*requeueRefusal](err); ok {
		switch rr.code {
		case httpplatform.CodeNotQuarantined:
			return fmt.Errorf("sessions requeue: %s, so nothing was requeued; %s lists the key's last messages with their status, "+
				"agentgate sessions quarantined the quarantined ones, which a requeue runs", rr.msg, show)
		case httpplatform.CodeSessionEnded:
			// Not "nothing was requeued": a command that ended the session's work as the
			// requeue was stored sets the message aside again only once the command is stored
			// (the daemon's message says so).
			return fmt.Errorf("sessions requeue: %s; %s lists the key's last messages with their status", rr.msg, show)
		}
	}
	return fmt.Errorf("requeue %s of %s: %w", shortArg(id), shortKey(key), err)
}

// requeueAnswerLost is the error of a requeue whose answer did not come back: the operator
// looks before requeueing again (a second requeue of a queued message is refused anyway).
func requeueAnswerLost(key, id string, err error) error {
	shown := pasteableKey(key)
	return fmt.Errorf("requeue %s of %s: %v: it may have requeued the message: see agentgate sessions show %s", id, shown, err, shown)
}

// requeueJSON is what sessions requeue --json prints: the requeue the daemon (or cluster
// member) made, as its answer says it (docs/CLI.md).
type requeueJSON struct {
	SessionKey  string `json:"session_key"`
	MessageID   string `json:"message_id"`
	SessionID   string `json:"session_id"`
	Disposition string `json:"disposition"`
	QueueDepth  int    `json:"queue_depth"`
	Address     string `json:"address"`
	Member      bool   `json:"member"`
}

// printRequeue reports a requeue the daemon (or cluster member: noun) at addr made: a line, or
// with asJSON one requeueJSON. A refusal prints nothing on stdout, with or without asJSON: it is
// the command's error (one line on stderr, exit 1), as sessions show's of a key with no session.
func printRequeue(w io.Writer, noun, addr string, res *httpplatform.MessageResponse, asJSON bool) error {
	if asJSON {
		return writeJSON(w, requeueJSON{SessionKey: res.SessionKey, MessageID: res.MessageID, SessionID: res.SessionID,
			Disposition: res.Disposition, QueueDepth: res.QueueDepth, Address: addr, Member: noun == "member"})
	}
	fmt.Fprintf(w, "requeued message %s of %s through the %s at %s: %s (%d waiting), in session %s; it runs as its sender's message\n",
		res.MessageID, pasteableKey(res.SessionKey), noun, addr, res.Disposition, res.QueueDepth, res.SessionID)
	return nil
}

// requeueCommand is the curl command line that requeues message id of key through the daemon at
// addr.
func requeueCommand(cfg *config.Config, addr, key, id string) string {
	return curlPost(cfg, addr, requeuePath(key, id))
}

// requeuePath is the API path that requeues message id of key. A message id may be "." or "..",
// which url.PathEscape leaves as they are and a server takes for a dot segment (the daemon
// answers such a path 404): those go escaped, as %2E.
func requeuePath(key, id string) string {
	seg := url.PathEscape(id)
	if id == "." || id == ".." {
		seg = strings.Repeat("%2E", len(id))
	}
	return "/v1/sessions/" + url.PathEscape(key) + "/messages/" + seg + "/requeue"
}

// parseKeyAndMessage parses fset's flags, which may come before, between and after the KEY and
// MESSAGE_ID arguments. It returns flag.ErrHelp after -h and errUsage after a usage error
// (parseFlags).
func parseKeyAndMessage(fset *flag.FlagSet, args []string, stdout, stderr io.Writer) (key, id string, err error) {
	var pos []string
	for {
		if err := parseFlags(fset, args, stdout, stderr); errors.Is(err, flag.ErrHelp) {
			return "", "", flag.ErrHelp
		} else if err != nil {
			return "", "", errUsage
		}
		if fset.NArg() == 0 {
			break
		}
		pos = append(pos, fset.Arg(0))
		args = fset.Args()[1:]
	}
	if len(pos) != 2 {
		fmt.Fprintf(stderr, "agentgate %s: want KEY MESSAGE_ID, got %d argument(s) (agentgate %[1]s -h says what they are)\n", fset.Name(), len(pos))
		return "", "", errUsage
	}
	key, err = parseKey(fset.Name(), pos[0])
	if err != nil {
		return "", "", err
	}
	if pos[1] == "" {
		return "", "", usagef("%s: the message id is empty", fset.Name())
	}
	return key, pos[1], nil
}
