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
	"strings"
	"time"
)

// Client talks to a Kafka Connect cluster's REST API (any worker: followers forward writes to
// the leader).
type Client struct {
	// URL of a worker's REST API. Default DefaultConnectURL.
	URL string
	// HTTP is the client used. Default http.DefaultClient.
	HTTP *http.Client
}

// Apply creates the connector of config or updates its configuration (PUT
// /connectors/<name>/config): Connect restarts its task with the new one. Run Prepare first.
//
// Connect resolves a PasswordReference when it takes the configuration: a provider that
// fails (the file provider's file cannot be read) makes it answer 500, which Apply returns
// with the reference named. A provider that is not declared, or the env provider with no such
// variable, is not refused: the task then fails to log in, which Status shows.
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

// Delete removes the connector (its offsets stay in Connect's offsets topic; its slot in
// PostgreSQL: DropSlot). An unknown connector is no error. While the cluster rebalances (409,
// 5xx, no answer) it asks again for up to 30 s.
func (c Client) Delete(ctx context.Context, name string) error {
	if name == "" {
		return errors.New("cdc: empty connector name")
	}
	// A worker that is rejoining the cluster, or a rebalance in progress (a worker died or
	// came back), answers 409 or 5xx, or not at all, for a while: ask again, for up to
	// deleteRetryFor (or until ctx ends).
	giveUp := time.Now().Add(deleteRetryFor)
	for {
		err := c.do(ctx, http.MethodDelete, "/connectors/"+url.PathEscape(name), nil, nil)
		if err == nil || IsNotFound(err) {
			return nil
		}
		var api *apiError
		if errors.As(err, &api) && api.Code != http.StatusConflict && api.Code < 500 || time.Now().After(giveUp) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Status is a connector's state as Connect reports it (GET /connectors/<name>/status).
type Status struct {
	Name      string `json:"name"`
	Connector State  `json:"connector"`
	Tasks     []Task `json:"tasks"`
}

// State is a connector's or task's state: RUNNING, PAUSED, FAILED, UNASSIGNED, RESTARTING.
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

// Running reports whether the connector and every task (at least one) are RUNNING.
func (s Status) Running() bool {
	if s.Connector.State != "RUNNING" || len(s.Tasks) == 0 {
		return false
	}
	for _, t := range s.Tasks {
		if t.State.State != "RUNNING" {
			return false
		}
	}
	return true
}

// KafkaClusterID returns the ID of the Kafka cluster the Connect workers belong to, and write
// the connectors' records to (the root resource of Connect's REST API). Compare it with the
// cluster a consumer reads: records of a connector go only there.
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

// Status returns the connector's state; an unknown connector is an error IsNotFound reports.
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

// RestartTask restarts task id of the connector (a FAILED task stays failed until then).
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

func (c Client) do(ctx context.Context, method, path string, body, out any) error {
	if strings.HasPrefix(path, "/connectors//") || path == "/connectors/" {
		return errors.New("cdc: empty connector name")
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("cdc: encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	base := strings.TrimSuffix(cmp.Or(c.URL, DefaultConnectURL), "/")
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return fmt.Errorf("cdc: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("cdc: Connect %s %s (is the Connect cluster up? e2e/services up connect): %w", method, base+path, err)
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
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("cdc: Connect %s %s: decode answer: %w", method, path, err)
		}
	}
	return nil
}
