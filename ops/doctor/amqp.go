package doctor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// AMQPConfig reaches RabbitMQ.
type AMQPConfig struct {
	// URL is the AMQP URL of the consumers' virtual host (amqp://user:pass@host:5672/vhost).
	URL string
	// ManagementURL is the management API's base URL; default http on URL's host, port 15672,
	// with its credentials. Unreachable: the queue's arguments over AMQP instead.
	ManagementURL string
	HTTPClient    *http.Client // for the management API; default: a 5s timeout
}

const defaultManagementPort = "15672"

func (c *AMQPConfig) setDefaults() {
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: 5 * time.Second}
	}
	c.ManagementURL = cmp.Or(c.ManagementURL, managementURLOf(c.URL))
}

// managementURLOf is the management API's default URL for an AMQP URL: http on its host, port
// 15672, with its credentials ("" for no or an unreadable AMQP URL).
func managementURLOf(amqpURL string) string {
	u, err := url.Parse(amqpURL)
	if err != nil || amqpURL == "" {
		return ""
	}
	m := url.URL{Scheme: "http", Host: net.JoinHostPort(u.Hostname(), defaultManagementPort), User: u.User}
	return m.String()
}

// queueInfo is what is known of one queue.
type queueInfo struct {
	ttl          time.Duration // 0: none
	deadLetterEx string
	messages     int
	details      []string
}

// queueHorizons reads queue's message TTL and, through the management API, the TTLs of the
// queues its dead-letter exchange routes to: a redrive from a dead-letter queue sends copies
// as old as that queue keeps them.
func queueHorizons(ctx context.Context, cfg AMQPConfig, queue string) []horizon {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return []horizon{{source: "rabbitmq queue " + queue, details: []string{fmt.Sprintf("AMQP URL unreadable: %v", err)}}}
	}
	vhost := cmp.Or(strings.TrimPrefix(u.Path, "/"), "/")
	info, mgmtErr := managementQueue(ctx, cfg, vhost, queue)
	if mgmtErr != nil {
		return []horizon{amqpHorizon(cfg, queue, mgmtErr)}
	}
	out := []horizon{queueHorizon("rabbitmq queue "+queue, info, true)}
	if info.deadLetterEx == "" {
		return out
	}
	dlqs, err := managementBoundQueues(ctx, cfg, vhost, info.deadLetterEx)
	if err != nil {
		out[0].details = append(out[0].details, fmt.Sprintf("dead-letter exchange %s: bindings unread: %v", info.deadLetterEx, err))
	}
	for _, dlq := range dlqs {
		out = append(out, deadLetterHorizon(ctx, cfg, vhost, queue, dlq))
	}
	return out
}

// deadLetterHorizon reads dlq, a queue bound to the dead-letter exchange of queue.
func deadLetterHorizon(ctx context.Context, cfg AMQPConfig, vhost, queue, dlq string) horizon {
	di, err := managementQueue(ctx, cfg, vhost, dlq)
	if err != nil {
		return horizon{source: "rabbitmq dead-letter queue " + dlq + " (of " + queue + ")", details: []string{err.Error()}}
	}
	return queueHorizon("rabbitmq dead-letter queue "+dlq+" (of "+queue+"; a redrive sends its messages back)", di, true)
}

// amqpHorizon reads queue over AMQP when the management API could not be reached (mgmtErr):
// the queue's own arguments only, and the dead-letter exchange named but not followed.
func amqpHorizon(cfg AMQPConfig, queue string, mgmtErr error) horizon {
	note := fmt.Sprintf("management API at %s not reachable (%v): enable it with `rabbitmq-plugins enable rabbitmq_management` to read policies and follow dead-letter queues; read over AMQP instead (the queue's own arguments; a policy's message-ttl is invisible)",
		redactURL(cfg.ManagementURL), mgmtErr)
	info, err := amqpQueue(cfg.URL, queue)
	if err != nil {
		return horizon{source: "rabbitmq queue " + queue, details: []string{note, err.Error()}}
	}
	h := queueHorizon("rabbitmq queue "+queue, info, true)
	h.details = append([]string{note}, h.details...)
	if info.deadLetterEx != "" {
		h.details = append(h.details, fmt.Sprintf("its dead-letter exchange is %s: list the queues bound to it in the consumer's AMQPQueues to check them", info.deadLetterEx))
	}
	return h
}

func queueHorizon(source string, info queueInfo, known bool) horizon {
	h := horizon{source: source, known: known, details: info.details}
	if info.ttl > 0 {
		h.horizon = info.ttl
	} else {
		h.horizon = Unbounded
	}
	return h
}

// managementQueue reads one queue through the management API.
func managementQueue(ctx context.Context, cfg AMQPConfig, vhost, queue string) (queueInfo, error) {
	var q struct {
		Arguments map[string]any `json:"arguments"`
		Policy    map[string]any `json:"effective_policy_definition"`
		PolicyNm  any            `json:"policy"`
		Messages  int            `json:"messages"`
	}
	if err := managementGet(ctx, cfg, "/api/queues/"+url.PathEscape(vhost)+"/"+url.PathEscape(queue), &q); err != nil {
		return queueInfo{}, err
	}
	info := queueInfo{messages: q.Messages}
	argTTL, argOK := number(q.Arguments["x-message-ttl"])
	polTTL, polOK := number(q.Policy["message-ttl"])
	info.ttl = smallestTTL(q.Arguments["x-message-ttl"], q.Policy["message-ttl"])
	argDLX, _ := q.Arguments["x-dead-letter-exchange"].(string)
	polDLX, _ := q.Policy["dead-letter-exchange"].(string)
	info.deadLetterEx = cmp.Or(argDLX, polDLX)
	info.details = []string{fmt.Sprintf("queue %s (management API): x-message-ttl=%s, policy message-ttl=%s, dead-letter exchange=%q, %d messages",
		queue, orNone(argTTL, argOK), orNone(polTTL, polOK), info.deadLetterEx, q.Messages)}
	return info, nil
}

// smallestTTL is the smaller of the TTLs (milliseconds, as the management API gives them) that
// are set: the one that drops a message first. 0: none is set.
func smallestTTL(ttls ...any) time.Duration {
	var set []int64
	for _, v := range ttls {
		if n, ok := number(v); ok {
			set = append(set, n)
		}
	}
	if len(set) == 0 {
		return 0
	}
	return time.Duration(slices.Min(set)) * time.Millisecond
}

// managementBoundQueues lists the queues bound to exchange.
func managementBoundQueues(ctx context.Context, cfg AMQPConfig, vhost, exchange string) ([]string, error) {
	var bindings []struct {
		Destination     string `json:"destination"`
		DestinationType string `json:"destination_type"`
	}
	if err := managementGet(ctx, cfg, "/api/exchanges/"+url.PathEscape(vhost)+"/"+url.PathEscape(exchange)+"/bindings/source", &bindings); err != nil {
		return nil, err
	}
	var out []string
	for _, b := range bindings {
		if b.DestinationType == "queue" {
			out = append(out, b.Destination)
		}
	}
	return out, nil
}

// managementGet decodes the JSON answer of the management API to GET path into v.
func managementGet(ctx context.Context, cfg AMQPConfig, path string, v any) error {
	req, err := managementRequest(ctx, cfg.ManagementURL, path)
	if err != nil {
		return err
	}
	resp, err := cfg.HTTPClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}

// managementRequest is the GET of path on the management API at base, with base's credentials
// as basic authentication.
func managementRequest(ctx context.Context, base, path string) (*http.Request, error) {
	if base == "" {
		return nil, errors.New("no management URL")
	}
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(u.Scheme+"://"+u.Host+u.Path, "/")+path, nil)
	if err != nil {
		return nil, err
	}
	if u.User != nil {
		pw, _ := u.User.Password()
		req.SetBasicAuth(u.User.Username(), pw)
	}
	return req, nil
}

// amqpQueue reads over AMQP what it can: the queue exists (passive declare: messages,
// consumers), and its x-message-ttl and x-dead-letter-exchange arguments, which AMQP has no
// method to read: a declare with a deliberately different value is refused with a
// PRECONDITION_FAILED that names the current one, and changes nothing.
func amqpQueue(amqpURL, queue string) (queueInfo, error) {
	conn, err := amqp.DialConfig(amqpURL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return queueInfo{}, fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return queueInfo{}, err
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return queueInfo{}, fmt.Errorf("queue %s: passive declare: %w", queue, err)
	}
	_ = ch.Close()
	info := queueInfo{messages: q.Messages}
	ttl, err := probeArgument(conn, queue, "x-message-ttl", int32(1))
	if err != nil {
		return info, err
	}
	dlx, err := probeArgument(conn, queue, "x-dead-letter-exchange", "wmonce-doctor-probe")
	if err != nil {
		return info, err
	}
	if v, err := strconv.ParseInt(ttl, 10, 64); err == nil {
		info.ttl = time.Duration(v) * time.Millisecond
	}
	info.deadLetterEx = dlx
	info.details = []string{fmt.Sprintf("queue %s (AMQP: passive declare, argument probes): %d messages, %d consumers, x-message-ttl=%s, x-dead-letter-exchange=%q",
		queue, q.Messages, q.Consumers, cmpStr(ttl, "none"), dlx)}
	return info, nil
}

// inequivalent matches RabbitMQ's refusal, in the wording of 3.x ("current is the value '60000'
// of type 'signedint'") and of 4.x ("current is '60000'"), or "current is none".
var inequivalent = regexp.MustCompile(`inequivalent arg '([^']+)'.*?current is (none|(?:the value )?'([^']*)'(?: of type '([^']*)')?)`)

// probeArgument returns queue's current value of arg ("" when unset), by declaring the queue
// with arg=sentinel: RabbitMQ refuses an inequivalent declare and names the current value. The
// queue's other properties (durable, auto-delete, x-queue-type...) are matched first, from the
// same refusals.
func probeArgument(conn *amqp.Connection, queue, arg string, sentinel any) (string, error) {
	d := declaration{durable: true, args: amqp.Table{arg: sentinel}}
	for range 8 {
		ch, err := conn.Channel()
		if err != nil {
			return "", err
		}
		// Declared passively just before: the queue exists, so this declare cannot create it.
		_, err = ch.QueueDeclare(queue, d.durable, d.autoDelete, false, false, d.args)
		if err == nil {
			_ = ch.Close()
			return fmt.Sprint(sentinel), nil // the queue's value is the sentinel itself
		}
		m := inequivalent.FindStringSubmatch(err.Error())
		if m == nil {
			return "", fmt.Errorf("queue %s: probe of %s: %w", queue, arg, err)
		}
		if m[1] == arg {
			return m[3], nil
		}
		d.match(m)
	}
	return "", fmt.Errorf("queue %s: probe of %s did not converge", queue, arg)
}

// declaration is what probeArgument declares the queue with.
type declaration struct {
	durable, autoDelete bool
	args                amqp.Table
}

// match takes the current value of the property a refusal (inequivalent's submatches) named,
// so that the next declare differs from the queue only in the probed argument.
func (d *declaration) match(m []string) {
	switch name := m[1]; {
	case name == "durable":
		d.durable = !d.durable
	case name == "auto_delete":
		d.autoDelete = !d.autoDelete
	case m[2] == "none":
		delete(d.args, name)
	default:
		d.args[name] = typed(m[3], m[4])
	}
}

// typed converts a value a refusal names back to the type the queue holds it in: 3.x names the
// type, 4.x does not (a number is then taken for an integer, int32 when it fits).
func typed(v, typ string) any {
	if typ == "bool" {
		return v == "true"
	}
	n, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err != nil, !integerTypes[typ]:
		return v
	case typ == "signedint", typ == "" && n == int64(int32(n)):
		return int32(n)
	}
	return n
}

// integerTypes are the integer types RabbitMQ names in a refusal, and "" (4.x names none).
var integerTypes = map[string]bool{"": true, "signedint": true, "long": true, "short": true, "byte": true}

func number(v any) (int64, bool) {
	switch n := v.(type) {
	case float64:
		return int64(n), true
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	}
	return 0, false
}

func orNone(v int64, ok bool) string {
	if !ok {
		return "none"
	}
	return strconv.FormatInt(v, 10) + "ms"
}

func cmpStr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	u.User = nil
	return u.String()
}
