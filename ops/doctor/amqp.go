package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
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
	if c.ManagementURL == "" && c.URL != "" {
		if u, err := url.Parse(c.URL); err == nil {
			m := url.URL{Scheme: "http", Host: net.JoinHostPort(u.Hostname(), defaultManagementPort), User: u.User}
			c.ManagementURL = m.String()
		}
	}
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
	vhost := strings.TrimPrefix(u.Path, "/")
	if vhost == "" {
		vhost = "/"
	}
	info, mgmtErr := managementQueue(ctx, cfg, vhost, queue)
	if mgmtErr == nil {
		out := []horizon{queueHorizon("rabbitmq queue "+queue, info, true)}
		if info.deadLetterEx != "" {
			dlqs, err := managementBoundQueues(ctx, cfg, vhost, info.deadLetterEx)
			if err != nil {
				out[0].details = append(out[0].details, fmt.Sprintf("dead-letter exchange %s: bindings unread: %v", info.deadLetterEx, err))
			}
			for _, dlq := range dlqs {
				di, err := managementQueue(ctx, cfg, vhost, dlq)
				if err != nil {
					out = append(out, horizon{source: "rabbitmq dead-letter queue " + dlq + " (of " + queue + ")", details: []string{err.Error()}})
					continue
				}
				out = append(out, queueHorizon("rabbitmq dead-letter queue "+dlq+" (of "+queue+"; a redrive sends its messages back)", di, true))
			}
		}
		return out
	}
	// No management API: say so, and read what AMQP itself tells.
	note := fmt.Sprintf("management API at %s not reachable (%v): enable it with `rabbitmq-plugins enable rabbitmq_management` to read policies and follow dead-letter queues; read over AMQP instead (the queue's own arguments; a policy's message-ttl is invisible)",
		redactURL(cfg.ManagementURL), mgmtErr)
	info, err = amqpQueue(cfg.URL, queue)
	if err != nil {
		return []horizon{{source: "rabbitmq queue " + queue, details: []string{note, err.Error()}}}
	}
	h := queueHorizon("rabbitmq queue "+queue, info, true)
	h.details = append([]string{note}, h.details...)
	if info.deadLetterEx != "" {
		h.details = append(h.details, fmt.Sprintf("its dead-letter exchange is %s: list the queues bound to it in the consumer's AMQPQueues to check them", info.deadLetterEx))
	}
	return []horizon{h}
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
	switch {
	case argOK && polOK:
		info.ttl = time.Duration(min(argTTL, polTTL)) * time.Millisecond
	case argOK:
		info.ttl = time.Duration(argTTL) * time.Millisecond
	case polOK:
		info.ttl = time.Duration(polTTL) * time.Millisecond
	}
	info.deadLetterEx, _ = q.Arguments["x-dead-letter-exchange"].(string)
	if info.deadLetterEx == "" {
		info.deadLetterEx, _ = q.Policy["dead-letter-exchange"].(string)
	}
	info.details = []string{fmt.Sprintf("queue %s (management API): x-message-ttl=%s, policy message-ttl=%s, dead-letter exchange=%q, %d messages",
		queue, orNone(argTTL, argOK), orNone(polTTL, polOK), info.deadLetterEx, q.Messages)}
	return info, nil
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

func managementGet(ctx context.Context, cfg AMQPConfig, path string, v any) error {
	if cfg.ManagementURL == "" {
		return errors.New("no management URL")
	}
	base, err := url.Parse(cfg.ManagementURL)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base.Scheme+"://"+base.Host+base.Path, "/")+path, nil)
	if err != nil {
		return err
	}
	if base.User != nil {
		pw, _ := base.User.Password()
		req.SetBasicAuth(base.User.Username(), pw)
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
	durable, autoDelete := true, false
	args := amqp.Table{arg: sentinel}
	for range 8 {
		ch, err := conn.Channel()
		if err != nil {
			return "", err
		}
		// Declared passively just before: the queue exists, so this declare cannot create it.
		_, err = ch.QueueDeclare(queue, durable, autoDelete, false, false, args)
		if err == nil {
			_ = ch.Close()
			return fmt.Sprint(sentinel), nil // the queue's value is the sentinel itself
		}
		m := inequivalent.FindStringSubmatch(err.Error())
		if m == nil {
			return "", fmt.Errorf("queue %s: probe of %s: %w", queue, arg, err)
		}
		switch name, current := m[1], m[3]; {
		case name == arg:
			return current, nil
		case name == "durable":
			durable = !durable
		case name == "auto_delete":
			autoDelete = !autoDelete
		case m[2] == "none":
			delete(args, name)
		default:
			args[name] = typed(current, m[4])
		}
	}
	return "", fmt.Errorf("queue %s: probe of %s did not converge", queue, arg)
}

func typed(v, typ string) any {
	if typ == "" { // 4.x does not say: a number is taken for an integer
		if n, err := strconv.ParseInt(v, 10, 32); err == nil {
			return int32(n)
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
		return v
	}
	switch typ {
	case "signedint", "long", "short", "byte":
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			if typ == "signedint" {
				return int32(n)
			}
			return n
		}
	case "bool":
		return v == "true"
	}
	return v
}

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
