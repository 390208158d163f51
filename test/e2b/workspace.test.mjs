// Workspaces through E2B: a sandbox created as a native workspace
// (POST /v1/workspaces, with the same key the SDK uses) is one E2B's
// Sandbox.connect reaches, and its commands start in the checkout.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { apiUrl } from './helpers.mjs'

const repo = process.env.BERTH_TEST_REPO

// createWorkspace creates a workspace through the native API and returns
// the ready sandbox (the answer is a stream of JSON lines, the last one
// holding the sandbox or an error).
async function createWorkspace(key) {
  const res = await fetch(apiUrl + '/v1/workspaces', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` },
    body: JSON.stringify({ repo, ref: 'main', timeout: '120s' }),
  })
  const text = await res.text()
  assert.equal(res.status, 200, text)
  const lines = text.trim().split('\n').map((l) => JSON.parse(l))
  const last = lines[lines.length - 1]
  assert.ok(last.sandbox, `workspace create ended without a sandbox: ${text}`)
  return last.sandbox
}

test('Sandbox.connect reaches a native workspace, whose commands start in the checkout', { skip: !repo && 'BERTH_TEST_REPO is not set' }, async () => {
  const ws = await createWorkspace(process.env.E2B_API_KEY)
  const sbx = await Sandbox.connect(ws.id)
  try {
    assert.equal(sbx.sandboxId, ws.id)
    const pwd = await sbx.commands.run('pwd')
    assert.equal(pwd.stdout.trim(), '/workspace')
    const readme = await sbx.commands.run('cat README')
    assert.equal(readme.stdout, 'hello from the repository\n')
    assert.equal(await sbx.files.read('/workspace/ready.txt'), 'set up\n')
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, ws.id)
    assert.ok(await sbx.isRunning())
    // Another key sees no such sandbox, as for any sandbox it does not own.
    if (process.env.E2B_API_KEY_2) {
      await assert.rejects(Sandbox.connect(ws.id, { apiKey: process.env.E2B_API_KEY_2 }), /not found/)
    }
  } finally {
    await sbx.kill()
  }
})
