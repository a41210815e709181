package cdc

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/wmonce/watermill-once/internal/worker"
)

// Client talks to a Kafka Connect cluster's REST API (any worker).
type Client struct {
	URL  string       // a worker's REST API; default DefaultConnectURL
	HTTP *http.Client // default http.DefaultClient
}

// Apply creates the connector of config or updates its configuration, after Prepare. A
// PasswordReference the workers cannot resolve is refused or fails the task's login (Status).
func (c Client) Apply(ctx context.Context, config Config) error {
	connector, err := ConnectorConfig(config)
	if err != nil {
		return err
	}
	config.setDefaults()
	err = c.do(ctx, http.MethodPut, "/connectors/"+url.PathEscape(config.Name)+"/config", connector, nil)
	var api *apiError
	if config.PasswordReference != "" && errors.As(err, &api) && api.Code >= 500 {
		return fmt.Errorf("%w (if the workers could not resolve the password reference %s: each must declare its provider in config.providers and be able to read what it names)", err, config.PasswordReference)
	}
	return err
}

// deleteRetryFor bounds how long Delete asks again while the cluster is rebalancing or a
// worker does not answer.
const deleteRetryFor = 30 * time.Second

// Delete removes the connector (not its slot: Remove does both); an unknown one is no error.
// It asks again for up to 30s while the cluster rebalances.
func (c Client) Delete(ctx context.Context, name string) error {
	if name == "" {
		return errors.New("cdc: empty connector name")
	}
	// A worker that is rejoining the cluster, or a rebalance in progress (a worker died or
	// came back), answers 409 or 5xx, or not at all, for a while: ask again, for up to
	// deleteRetryFor (or until ctx ends).
	return retry(ctx, deleteRetryFor, 500*time.Millisecond, func(last bool) (bool, error) {
		err := c.do(ctx, http.MethodDelete, "/connectors/"+url.PathEscape(name), nil, nil)
		if err == nil || IsNotFound(err) {
			return true, nil
		}
		return last || !rebalancing(err), err
	})
}

// rebalancing reports an answer that a cluster gives while it rebalances or a worker rejoins:
// 409, 5xx, or none at all.
func rebalancing(err error) bool {
	var api *apiError
	return !errors.As(err, &api) || api.Code == http.StatusConflict || api.Code >= 500
}

// retry calls try every interval until it reports done, passing last once the time given
// (after) has run out; it returns try's last error. When ctx ends first it returns that error
// with ctx's.
func retry(ctx context.Context, after, interval time.Duration, try func(last bool) (done bool, err error)) error {
	giveUp := time.Now().Add(after)
	for {
		done, err := try(time.Now().After(giveUp))
		if done {
			return err
		}
		if !worker.Sleep(ctx, interval) {
			return fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		}
	}
}

// Status is a connector's state and its tasks', as Connect reports them.
type Status struct {
	Name      string `json:"name"`
	Connector State  `json:"connector"`
	Tasks     []Task `json:"tasks"`
}

// State is a connector's or task's state (RUNNING, FAILED, ...).
type State struct {
	State    string `json:"state"`
	WorkerID string `json:"worker_id"`
	Trace    string `json:"trace,omitempty"`
}

// Task is one task of a connector.
type Task struct {
	ID int `json:"id"`
	State
}

// Running reports whether the connector and all its tasks (at least one) are RUNNING.
func (s Status) Running() bool {
	return s.Connector.State == "RUNNING" && len(s.Tasks) > 0 &&
		!slices.ContainsFunc(s.Tasks, func(t Task) bool { return t.State.State != "RUNNING" })
}

// KafkaClusterID returns the ID of the Kafka cluster the records go to.
func (c Client) KafkaClusterID(ctx context.Context) (string, error) {
	var info struct {
		KafkaClusterID string `json:"kafka_cluster_id"`
	}
	if err := c.do(ctx, http.MethodGet, "/", nil, &info); err != nil {
		return "", err
	}
	if info.KafkaClusterID == "" {
		return "", errors.New("cdc: Connect's root resource names no kafka_cluster_id")
	}
	return info.KafkaClusterID, nil
}

// Status returns the connector's state; an unknown one is an error IsNotFound reports.
func (c Client) Status(ctx context.Context, name string) (Status, error) {
	var s Status
	err := c.do(ctx, http.MethodGet, "/connectors/"+url.PathEscape(name)+"/status", nil, &s)
	return s, err
}

// Config returns the connector's configuration as Connect stores it.
func (c Client) Config(ctx context.Context, name string) (map[string]string, error) {
	var m map[string]string
	err := c.do(ctx, http.MethodGet, "/connectors/"+url.PathEscape(name)+"/config", nil, &m)
	return m, err
}

// RestartTask restarts task id of the connector (a FAILED task stays so until then).
func (c Client) RestartTask(ctx context.Context, name string, id int) error {
	return c.do(ctx, http.MethodPost, fmt.Sprintf("/connectors/%s/tasks/%d/restart", url.PathEscape(name), id), nil, nil)
}

// apiError is an error answer of Connect's REST API (IsNotFound tells a 404).
type apiError struct {
	Method, Path string
	Code         int
	Message      string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("cdc: Connect %s %s: %d %s", e.Method, e.Path, e.Code, e.Message)
}

// IsNotFound reports an API answer 404 (no such connector).
func IsNotFound(err error) bool {
	var e *apiError
	return errors.As(err, &e) && e.Code == http.StatusNotFound
}

// do sends one request to the REST API and decodes its answer into out (when not nil); an error
// answer is an *apiError.
func (c Client) do(ctx context.Context, method, path string, body, out any) error {
	req, err := c.newRequest(ctx, method, path, body)
	if err != nil {
		return err
	}
	resp, err := cmp.Or(c.HTTP, http.DefaultClient).Do(req)
	if err != nil {
		return fmt.Errorf("cdc: Connect %s %s (is the Connect cluster up? e2e/services up connect): %w", method, req.URL, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("cdc: Connect %s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		var e struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(raw, &e)
		return &apiError{Method: method, Path: path, Code: resp.StatusCode, Message: cmp.Or(e.Message, strings.TrimSpace(string(raw)))}
	}
	if out == nil || len(raw) == 0 {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("cdc: Connect %s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// newRequest builds a request to the REST API at path with body as JSON (none when nil). A path
// without a connector name is refused: it would address the collection.
func (c Client) newRequest(ctx context.Context, method, path string, body any) (*http.Request, error) {
	if strings.Contains(path+"/", "/connectors//") { // "/connectors/" + "" + an optional suffix
		return nil, errors.New("cdc: empty connector name")
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("cdc: encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	base := strings.TrimSuffix(cmp.Or(c.URL, DefaultConnectURL), "/")
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("cdc: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	return req, nil
}
