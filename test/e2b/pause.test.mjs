// Pause and resume through the unchanged SDK: sandbox.pause(), resume by
// Sandbox.connect(), lifecycle { onTimeout: 'pause', autoResume: true },
// listing paused sandboxes. On runc a pause keeps the sandbox's files and
// ends its processes (getInfo through Berth's native API says
// "filesystem"); the files, envs and token survive.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { newSandbox, waitFor, apiUrl } from './helpers.mjs'

// native reads the sandbox through Berth's own API, which says what a
// pause kept.
async function native(id) {
  const r = await fetch(`${apiUrl}/v1/sandboxes/${id}`)
  assert.equal(r.status, 200)
  return r.json()
}

test('pause() pauses, a second pause() says already paused, connect() resumes with the files kept', async () => {
  const sbx = await newSandbox({ envs: { KEPT: 'env kept' } })
  await sbx.files.write('/home/user/note', 'written before the pause')
  assert.equal(await sbx.pause(), true)
  assert.equal(await sbx.pause(), false, 'pausing a paused sandbox reports it was paused already')
  const info = await Sandbox.getInfo(sbx.sandboxId)
  assert.equal(info.state, 'paused')
  assert.equal(await sbx.isRunning(), false)
  const n = await native(sbx.sandboxId)
  assert.equal(n.state, 'paused')
  assert.ok(['memory', 'filesystem'].includes(n.pause), `pause = ${n.pause}`)

  const paused = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
  assert.ok(paused.some((s) => s.sandboxId === sbx.sandboxId), 'listed with state=paused')
  const running = await Sandbox.list({ query: { state: ['running'] } }).nextItems()
  assert.ok(!running.some((s) => s.sandboxId === sbx.sandboxId), 'not listed with state=running')

  const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 })
  assert.equal(again.sandboxId, sbx.sandboxId)
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running')
  assert.equal(await again.files.read('/home/user/note'), 'written before the pause')
  const r = await again.commands.run('echo "$KEPT"')
  assert.equal(r.stdout, 'env kept\n')
})

test('lifecycle { onTimeout: pause, autoResume: true }: paused at the deadline, resumed by the next request', async () => {
  const sbx = await newSandbox({ timeoutMs: 3_000, envs: { KEPT: 'yes' }, lifecycle: { onTimeout: 'pause', autoResume: true } })
  // Nothing goes to its data plane before the pause: a request would
  // resume it.
  assert.deepEqual((await Sandbox.getInfo(sbx.sandboxId)).lifecycle, { onTimeout: 'pause', autoResume: true })
  await waitFor('the sandbox to be paused at its deadline', async () => (await Sandbox.getInfo(sbx.sandboxId)).state === 'paused', 60_000)
  // The next data-plane request resumes it and succeeds.
  assert.equal((await sbx.commands.run('echo "$KEPT"')).stdout, 'yes\n')
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running')
})

test('on gVisor, pause() keeps memory: a background process counts on after connect()', async (t) => {
  const sbx = await newSandbox()
  if ((await native(sbx.sandboxId)).isolation !== 'gvisor') {
    t.skip('runc keeps files only (BERTH_TEST_E2B_GVISOR=1 runs this file on a gVisor template)')
    return
  }
  // The count lives in the shell's memory. Each value replaces the file
  // by rename, so no read (and no checkpoint taken between a truncate and
  // a write) finds it empty.
  const h = await sbx.commands.run('i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new && mv /tmp/count.new /tmp/count; sleep 0.05; done', { background: true })
  // The command keeps running; its output stream goes (a pause would cut
  // it anyway: the daemon closes its connections into a sandbox before
  // the checkpoint, as this runsc cannot save a connected one).
  await h.disconnect()
  // Until the counter's first write the file is not there.
  await waitFor('the counter to count', async () => Number(await sbx.files.read('/tmp/count').catch(() => '0')) > 0, 60_000)
  const before = Number(await sbx.files.read('/tmp/count'))
  assert.equal(await sbx.pause(), true)
  assert.equal((await native(sbx.sandboxId)).pause, 'memory')
  const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 })
  const first = Number(await again.files.read('/tmp/count'))
  assert.ok(first >= before, `count ${first} after resume, ${before} before: the process's memory was kept`)
  await waitFor('the counter to count on', async () => Number(await again.files.read('/tmp/count')) > first, 60_000)
})
