// commands.* through the unchanged SDK.
import { test, before } from 'node:test'
import assert from 'node:assert/strict'
import { CommandExitError, TimeoutError } from 'e2b'
import { newSandbox, waitFor } from './helpers.mjs'

let sbx
before(async () => {
  sbx = await newSandbox()
})

test('run: stdout, stderr and exit code', async () => {
  const r = await sbx.commands.run('echo out; echo err >&2; exit 0')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'out\n')
  assert.equal(r.stderr, 'err\n')
  await assert.rejects(sbx.commands.run('echo partial; echo bad >&2; exit 3'), (err) => {
    assert.ok(err instanceof CommandExitError, `got ${err}`)
    assert.equal(err.exitCode, 3)
    assert.equal(err.stdout, 'partial\n')
    assert.equal(err.stderr, 'bad\n')
    return true
  })
})

test('run: envs, cwd and user', async () => {
  const r = await sbx.commands.run('echo "$A-$B"; pwd; whoami', { envs: { A: 'one', B: 'two' }, cwd: '/tmp' })
  assert.equal(r.stdout, 'one-two\n/tmp\nuser\n')
  const root = await sbx.commands.run('whoami; echo $HOME', { user: 'root' })
  assert.equal(root.stdout, 'root\n/root\n')
  const dflt = await sbx.commands.run('whoami; pwd')
  assert.equal(dflt.stdout, 'user\n/home/user\n', 'E2B sandboxes default to user "user" in its home')
})

test('run: timeoutMs ends a long command', async () => {
  const start = Date.now()
  await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 1_000 }), TimeoutError)
  // TimeoutError is the SDK's own verdict; the bound only says the command
  // did not run its 30 s (generous, for loaded hosts).
  assert.ok(Date.now() - start < 29_000)
})

test('run: onStdout and onStderr stream output as it comes', async () => {
  const out = []
  const err = []
  const r = await sbx.commands.run('for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.1; done', {
    onStdout: (d) => out.push(d),
    onStderr: (d) => err.push(d),
  })
  assert.equal(out.join(''), 'o1\no2\no3\n')
  assert.equal(err.join(''), 'e1\ne2\ne3\n')
  assert.ok(out.length >= 2, `stdout came in ${out.length} chunk(s), want it streamed`)
  assert.equal(r.stdout, 'o1\no2\no3\n')
})

test('background handles: wait and kill; commands.list', async () => {
  const h = await sbx.commands.run('sleep 0.5; echo done', { background: true })
  assert.ok(h.pid > 0)
  const r = await h.wait()
  assert.equal(r.stdout, 'done\n')
  assert.equal(r.exitCode, 0)

  const long = await sbx.commands.run('sleep 300', { background: true })
  const listed = await sbx.commands.list()
  const mine = listed.find((p) => p.pid === long.pid)
  assert.ok(mine, `pid ${long.pid} not in ${JSON.stringify(listed)}`)
  assert.equal(mine.cmd, '/bin/bash')
  assert.ok(mine.args.join(' ').includes('sleep 300'))
  assert.equal(await long.kill(), true)
  await assert.rejects(long.wait(), (err) => {
    assert.ok(err instanceof CommandExitError)
    assert.notEqual(err.exitCode, 0)
    return true
  })
  await waitFor('the killed command to leave the list', async () => !(await sbx.commands.list()).some((p) => p.pid === long.pid))
  assert.equal(await sbx.commands.kill(long.pid), false, 'kill of a gone pid reports false')
})

test('sendStdin feeds a running command', async () => {
  const h = await sbx.commands.run('read a; read b; echo "got $a and $b"', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, 'first\n')
  await sbx.commands.sendStdin(h.pid, 'second\n')
  const r = await h.wait()
  assert.equal(r.stdout, 'got first and second\n')
})

test('commands.connect attaches to a running command', async () => {
  const h = await sbx.commands.run('sleep 1; echo late output; exit 4', { background: true })
  const seen = []
  const again = await sbx.commands.connect(h.pid, { onStdout: (d) => seen.push(d) })
  await assert.rejects(again.wait(), (err) => {
    assert.ok(err instanceof CommandExitError)
    assert.equal(err.exitCode, 4)
    return true
  })
  assert.equal(seen.join(''), 'late output\n')
})

test('a background command outlives its closed stream (envd semantics)', async () => {
  const flag = `/tmp/go-${Date.now()}`
  const h = await sbx.commands.run(`while [ ! -e ${flag} ]; do sleep 0.05; done; echo survived`, { background: true })
  await h.disconnect()
  // A round trip later the agent has seen the stream go; the command runs on.
  await sbx.commands.run('true')
  assert.ok((await sbx.commands.list()).some((p) => p.pid === h.pid), 'the command is still listed after its stream closed')
  const again = await sbx.commands.connect(h.pid)
  await sbx.files.write(flag, '')
  const r = await again.wait()
  assert.equal(r.stdout, 'survived\n')
  assert.equal(r.exitCode, 0)
})
