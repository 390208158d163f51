// Shared setup of the E2B compatibility tests. The Go test
// (test/e2e/e2b_test.go) starts a daemon and sets E2B_API_URL,
// E2B_SANDBOX_URL, E2B_API_KEY, E2B_API_KEY_2 (a second key) and E2B_DOMAIN.
import { after } from 'node:test'
import { Sandbox } from 'e2b'

for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY', 'E2B_DOMAIN']) {
  if (!process.env[name]) throw new Error(`${name} is not set: run these tests through test/e2e/e2b_test.go`)
}

export const apiUrl = process.env.E2B_API_URL
export const domain = process.env.E2B_DOMAIN

const created = []

// newSandbox creates a sandbox from the base template that is killed when
// the test file ends.
export async function newSandbox(opts = {}) {
  const sbx = await Sandbox.create('base', { timeoutMs: 120_000, ...opts })
  created.push(sbx)
  return sbx
}

after(async () => {
  await Promise.all(created.map((s) => s.kill().catch(() => {})))
})

// waitFor polls cond until it is truthy or the deadline passes.
export async function waitFor(what, cond, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const v = await cond()
    if (v) return v
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 50))
  }
}

// api calls the control plane directly (for what the SDK hides).
export async function api(method, path, { key = process.env.E2B_API_KEY, body } = {}) {
  const headers = { 'Content-Type': 'application/json' }
  if (key) headers['X-API-Key'] = key
  const res = await fetch(apiUrl + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) })
  const text = await res.text()
  return { status: res.status, headers: res.headers, body: text ? JSON.parse(text) : undefined }
}
