package agentlink

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// Init gives a running agent a new identity through POST /init: env is
// set in its sandbox-wide environment, newToken replaces token (which
// stops working once Init returns), user ("": unchanged) becomes its
// default user, and a non-zero nproc lowers its RLIMIT_NPROC (which
// every process it starts inherits).
func (l *Link) Init(ctx context.Context, addr, token string, env map[string]string, newToken, user string, nproc uint64) error {
	body, err := json.Marshal(struct {
		EnvVars     map[string]string `json:"envVars,omitempty"`
		AccessToken string            `json:"accessToken,omitempty"`
		DefaultUser string            `json:"defaultUser,omitempty"`
		Nproc       uint64            `json:"berthNproc,omitempty"`
	}{env, newToken, user, nproc})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/init", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Access-Token", token)
	resp, err := (&http.Client{Transport: l.transport}).Do(req)
	if err != nil {
		return fmt.Errorf("init agent: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("init agent: agent answered %s: %s", resp.Status, msg)
	}
	return nil
}
