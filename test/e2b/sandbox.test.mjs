// Control plane through the unchanged SDK: create, connect, list, getInfo,
// setTimeout, kill, isRunning, getMetrics, keys, network (pause: pause.test.mjs).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { readFile } from 'node:fs/promises'
import { promisify } from 'node:util'
import { Sandbox, AuthenticationError, SandboxNotFoundError, NotFoundError, Secret } from 'e2b'
import { newSandbox, api, waitFor, domain } from './helpers.mjs'

test('Sandbox.create with timeoutMs, envs and metadata; getInfo reports them', async () => {
  const run = Date.now().toString()
  const sbx = await newSandbox({ timeoutMs: 90_000, envs: { GREETING: 'hi there' }, metadata: { run, 'free form/key': 'any value: ok' } })
  assert.match(sbx.sandboxId, /^[a-z0-9]+$/)
  assert.equal(sbx.sandboxDomain, domain)
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.templateId, 'base')
  assert.equal(info.state, 'running')
  assert.deepEqual(info.metadata, { run, 'free form/key': 'any value: ok' })
  assert.equal(info.envdVersion, '0.6.13')
  const life = info.endAt.getTime() - info.startedAt.getTime()
  assert.ok(Math.abs(life - 90_000) < 2_000, `endAt - startedAt = ${life} ms, want about 90000`)
  const r = await sbx.commands.run('echo "$GREETING"')
  assert.equal(r.stdout, 'hi there\n')
})

test('Sandbox.connect reaches the same running sandbox', async () => {
  const sbx = await newSandbox()
  await sbx.files.write('/tmp/marker', 'same sandbox')
  const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 200_000 })
  assert.equal(again.sandboxId, sbx.sandboxId)
  assert.equal(await again.files.read('/tmp/marker'), 'same sandbox')
  // connect with a longer timeout extends the deadline.
  const info = await again.getInfo()
  assert.ok(info.endAt.getTime() - Date.now() > 150_000, `endAt ${info.endAt.toISOString()} was not extended`)
  await assert.rejects(Sandbox.connect('nosuchsandbox0000000'), SandboxNotFoundError)
})

test('Sandbox.list filters by metadata and paginates', async () => {
  const run = 'list' + Date.now()
  const sbs = await Promise.all([0, 1, 2].map((i) => newSandbox({ metadata: { run, idx: String(i) } })))
  const other = await newSandbox({ metadata: { run: run + 'x' } })

  const one = await Sandbox.list({ query: { metadata: { run, idx: '1' } } }).nextItems()
  assert.deepEqual(one.map((s) => s.sandboxId), [sbs[1].sandboxId])
  assert.deepEqual(one[0].metadata, { run, idx: '1' })
  assert.equal(one[0].state, 'running')

  const pager = Sandbox.list({ query: { metadata: { run } }, limit: 2 })
  const first = await pager.nextItems()
  assert.equal(first.length, 2)
  assert.ok(pager.hasNext, 'want a next page after 2 of 3')
  const second = await pager.nextItems()
  assert.equal(second.length, 1)
  assert.equal(pager.hasNext, false)
  const ids = [...first, ...second].map((s) => s.sandboxId).sort()
  assert.deepEqual(ids, sbs.map((s) => s.sandboxId).sort())
  assert.ok(!ids.includes(other.sandboxId))
})

test('Sandbox.list is newest first and honours order, template and startedAfter', async () => {
  const run = 'order' + Date.now()
  const before = new Date()
  const sbs = []
  for (let i = 0; i < 3; i++) sbs.push(await newSandbox({ metadata: { run } }))
  const ids = sbs.map((s) => s.sandboxId)
  const listIds = async (opts) => (await Sandbox.list({ ...opts, query: { metadata: { run }, ...opts.query } }).nextItems()).map((s) => s.sandboxId)

  assert.deepEqual(await listIds({}), [...ids].reverse(), 'newest first by default')
  assert.deepEqual(await listIds({ order: 'desc' }), [...ids].reverse())
  assert.deepEqual(await listIds({ order: 'asc' }), ids)
  assert.deepEqual(await listIds({ query: { template: 'base' } }), [...ids].reverse())
  assert.deepEqual(await listIds({ query: { template: 'unknown-template' } }), [])
  const info = await sbs[1].getInfo()
  assert.ok(info.startedAt >= before)
  assert.deepEqual(await listIds({ query: { startedAfter: info.startedAt }, order: 'asc' }), ids.slice(1))
  assert.deepEqual(await listIds({ query: { startedAfter: new Date(Date.now() + 60_000) } }), [])

  // Pages stay stable while sandboxes are created between them: a newer
  // one sorts before the cursor and does not push an item onto the next
  // page twice.
  const pager = Sandbox.list({ query: { metadata: { run } }, limit: 2 })
  const first = await pager.nextItems()
  const late = await newSandbox({ metadata: { run } })
  const second = await pager.nextItems()
  assert.equal(pager.hasNext, false)
  assert.deepEqual([...first, ...second].map((s) => s.sandboxId), [...ids].reverse())
  assert.equal((await listIds({}))[0], late.sandboxId)
})

test('setTimeout moves the deadline and the sandbox dies at it', async () => {
  const sbx = await newSandbox()
  await sbx.setTimeout(3_000)
  const info = await sbx.getInfo()
  assert.ok(info.endAt.getTime() - Date.now() < 4_000, `endAt ${info.endAt.toISOString()} not within 4 s`)
  await waitFor('the sandbox to stop at its deadline', async () => !(await sbx.isRunning()), 15_000)
  await assert.rejects(sbx.getInfo(), SandboxNotFoundError)
})

test('kill and isRunning', async () => {
  const sbx = await newSandbox()
  assert.equal(await sbx.isRunning(), true)
  await sbx.kill()
  assert.equal(await sbx.isRunning(), false)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false, 'killing twice reports not found')
})

test('getMetrics reports usage', async () => {
  const sbx = await newSandbox()
  await sbx.commands.run('head -c 20000000 /dev/zero > /tmp/blob')
  const ms = await sbx.getMetrics()
  assert.ok(ms.length >= 1)
  // The last sample is taken now, after the write.
  const m = ms[ms.length - 1]
  assert.equal(m.cpuCount, 1)
  assert.ok(m.memTotal >= 256 << 20, `memTotal ${m.memTotal}`)
  assert.ok(m.memUsed > 0 && m.memUsed < m.memTotal, `memUsed ${m.memUsed}`)
  assert.ok(m.diskUsed >= 20_000_000, `diskUsed ${m.diskUsed} after writing 20 MB`)
  assert.ok(m.diskTotal > m.diskUsed, `diskTotal ${m.diskTotal}`)
  assert.ok(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, `cpuUsedPct ${m.cpuUsedPct}`)
  assert.ok(m.timestamp instanceof Date && !isNaN(m.timestamp))
})

test('getMetrics keeps a history (a sample every 5 s) and filters it by range', async () => {
  const sbx = await newSandbox()
  const started = (await sbx.getInfo()).startedAt
  // Wait for the daemon's sampler to take two samples of its own.
  const all = await waitFor('two recorded samples', async () => {
    const ms = await sbx.getMetrics({ start: started, end: new Date(Date.now() - 1000) })
    return ms.length >= 2 && ms
  }, 30_000)
  for (let i = 1; i < all.length; i++) assert.ok(all[i].timestamp > all[i - 1].timestamp, 'oldest first')
  for (const m of all) assert.ok(m.memUsed > 0 && m.memTotal >= m.memUsed && m.cpuCount === 1, JSON.stringify(m))
  // A range holding one recorded sample returns just it (the API counts
  // whole seconds; the SDK rounds, so name the sample's second exactly).
  const t = all[1].timestamp
  const second = new Date(Math.floor(t.getTime() / 1000) * 1000)
  const one = await sbx.getMetrics({ start: second, end: second })
  assert.deepEqual(one.map((m) => m.timestamp.getTime()), [t.getTime()])
  // Before the sandbox existed: nothing.
  assert.deepEqual(await sbx.getMetrics({ start: new Date(started.getTime() - 3_600_000), end: new Date(started.getTime() - 60_000) }), [])
  // Without a range: the history, then a sample taken now.
  const full = await sbx.getMetrics()
  assert.ok(full.length >= all.length + 1)
  assert.ok(Date.now() - full[full.length - 1].timestamp.getTime() < 5_000)
})

test('GET /sandboxes/metrics: a sample of each running sandbox asked for, none of others', async () => {
  const [a, b] = await Promise.all([newSandbox(), newSandbox()])
  await b.pause()
  const r = await api('GET', `/sandboxes/metrics?sandbox_ids=${a.sandboxId},${b.sandboxId},nosuchsandbox`)
  assert.equal(r.status, 200, JSON.stringify(r.body))
  assert.deepEqual(Object.keys(r.body.sandboxes), [a.sandboxId], 'the running one only: not the paused one, not an unknown one')
  const m = r.body.sandboxes[a.sandboxId]
  assert.ok(m.memUsed > 0 && m.memTotal >= m.memUsed && m.cpuCount >= 1 && m.diskTotal > 0, JSON.stringify(m))
  assert.ok(Math.abs(Date.now() / 1000 - m.timestampUnix) < 60, `taken now: ${m.timestampUnix}`)
  // Another key sees nothing of them.
  const other = await api('GET', `/sandboxes/metrics?sandbox_ids=${a.sandboxId}`, { key: process.env.E2B_API_KEY_2 })
  assert.equal(other.status, 200)
  assert.deepEqual(other.body.sandboxes, {})
  for (const q of ['', '?sandbox_ids=', '?sandbox_ids=' + Array.from({ length: 101 }, (_, i) => `s${i}`).join(',')]) {
    const bad = await api('GET', '/sandboxes/metrics' + q)
    assert.equal(bad.status, 400, q)
    assert.match(bad.body.message, /sandbox_ids/)
  }
})

test('sandbox logs: what the host recorded, its events and the commands run in it', async () => {
  const sbx = await newSandbox()
  await sbx.commands.run('echo logged-command')
  await assert.rejects(sbx.commands.run('exit 3'))
  let msgs = []
  const logs = await waitFor('both commands in the logs', async () => {
    const r = await api('GET', `/v2/sandboxes/${sbx.sandboxId}/logs`)
    assert.equal(r.status, 200, JSON.stringify(r.body))
    msgs = r.body.logs.map((e) => `${e.level} ${e.message}`)
    const ok = msgs.some((m) => m.startsWith('info ') && m.includes('echo logged-command') && m.endsWith('(exit 0)')) &&
      msgs.some((m) => m.startsWith('warn ') && m.includes('exit 3') && m.endsWith('(exit 3)'))
    return ok && r.body.logs
  }, 30_000).catch((err) => { throw new Error(`${err.message}: ${JSON.stringify(msgs)}`) })
  assert.ok(logs.some((e) => e.level === 'info' && e.message === 'ready' && e.fields.source === 'event'), JSON.stringify(logs))
  for (let i = 1; i < logs.length; i++) assert.ok(logs[i].timestamp >= logs[i - 1].timestamp, 'oldest first')
  const warn = await api('GET', `/v2/sandboxes/${sbx.sandboxId}/logs?level=warn&direction=backward&limit=1`)
  assert.equal(warn.body.logs.length, 1)
  assert.match(warn.body.logs[0].message, /exit 3/)
  const v1 = await api('GET', `/sandboxes/${sbx.sandboxId}/logs?limit=2`)
  assert.equal(v1.status, 200)
  assert.equal(v1.body.logs.length, 2)
  assert.equal(v1.body.logEntries.length, 2)
  assert.match(v1.body.logs[0].line, /^\[info\] /)
  const other = await api('GET', `/v2/sandboxes/${sbx.sandboxId}/logs`, { key: process.env.E2B_API_KEY_2 })
  assert.equal(other.status, 404)
})

test('requests without a valid API key get 401 in the E2B error shape', async () => {
  await assert.rejects(Sandbox.create('base', { apiKey: 'e2b_0000000000000000000000000000000000000000' }), AuthenticationError)
  for (const key of [null, 'e2b_00', 'not-a-key']) {
    const r = await api('GET', '/v2/sandboxes', { key })
    assert.equal(r.status, 401)
    assert.equal(r.body.code, 401)
    assert.match(r.body.message, /API key/)
  }
  const health = await fetch(process.env.E2B_API_URL + '/health')
  assert.equal(health.status, 204)
})

test('a key sees and touches only its own sandboxes', { skip: !process.env.E2B_API_KEY_2 }, async () => {
  const mine = await newSandbox({ metadata: { owner: 'key1' } })
  const other = { apiKey: process.env.E2B_API_KEY_2 }
  const theirs = await Sandbox.list({ ...other, query: { metadata: { owner: 'key1' } } }).nextItems()
  assert.deepEqual(theirs, [])
  await assert.rejects(Sandbox.getInfo(mine.sandboxId, other), SandboxNotFoundError)
  await assert.rejects(Sandbox.connect(mine.sandboxId, other), SandboxNotFoundError)
  assert.equal(await Sandbox.kill(mine.sandboxId, other), false)
  await assert.rejects(Sandbox.setTimeout(mine.sandboxId, 5_000, other), SandboxNotFoundError)
  assert.equal(await mine.isRunning(), true)
  // The data plane needs the sandbox's own token (or the owning key).
  const res = await fetch(process.env.E2B_SANDBOX_URL + '/envs', {
    headers: { 'E2b-Sandbox-Id': mine.sandboxId, 'X-API-Key': process.env.E2B_API_KEY_2 },
  })
  assert.equal(res.status, 401)
  const byOwner = await fetch(process.env.E2B_SANDBOX_URL + '/envs', {
    headers: { 'E2b-Sandbox-Id': mine.sandboxId, 'X-API-Key': process.env.E2B_API_KEY },
  })
  assert.equal(byOwner.status, 200)
})

// reach runs curl inside the sandbox and returns what it printed: the test
// net's echo ("host=… method=… path=…") when the request got through, the
// egress proxy's refusal or nothing when it did not.
async function reach(sbx, url) {
  const r = await sbx.commands.run(`curl -s -m 5 ${url} || true`, { user: 'root' })
  return r.stdout
}

test('network options map onto the egress policy: none by default, open, allow lists, updates', async () => {
  // The test net (a namespace the Go test made, treated as public by the
  // daemon) serves allowed.test and other.test over HTTP.
  assert.ok(process.env.BERTH_TEST_NET_IP, 'BERTH_TEST_NET_IP is set by test/e2e/e2b_test.go')
  const closed = await newSandbox()
  assert.doesNotMatch(await reach(closed, 'http://allowed.test/'), /host=/, 'no egress unless asked for')

  const open = await newSandbox({ allowInternetAccess: true })
  assert.match(await reach(open, 'http://allowed.test/hello'), /host=allowed.test method=GET path=\/hello/)
  // Open still never reaches the host's loopback or metadata addresses.
  assert.match(await reach(open, 'http://169.254.169.254/'), /forbidden: 169.254.169.254: cloud metadata/)

  const listed = await newSandbox({ network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] } })
  assert.match(await reach(listed, 'http://allowed.test/'), /host=allowed.test/)
  assert.doesNotMatch(await reach(listed, 'http://other.test/'), /host=/)
  assert.deepEqual((await listed.getInfo()).network.allowOut, ['allowed.test'])

  // Updating the network applies to the next connection.
  await listed.updateNetwork({ allowOut: ['other.test'], denyOut: ['0.0.0.0/0'] })
  assert.match(await reach(listed, 'http://other.test/'), /host=other.test/)
  assert.doesNotMatch(await reach(listed, 'http://allowed.test/'), /host=/)

  // Bad entries are refused by name and change nothing.
  await assert.rejects(newSandbox({ network: { denyOut: ['not an address'] } }), /denyOut/)
  await assert.rejects(listed.updateNetwork({ allowOut: ['bad domain!'] }), /bad domain/)
  assert.match(await reach(listed, 'http://other.test/'), /host=other.test/)
})

test('updateNetwork replaces the egress rules as E2B does; getInfo reports internet access and lifecycle', async () => {
  // second.test is the test net's second address; every other name is
  // its first.
  const ip2 = process.env.BERTH_TEST_NET_IP2
  assert.ok(ip2, 'BERTH_TEST_NET_IP2 is set by test/e2e/e2b_test.go')
  const closed = await newSandbox()
  const closedInfo = await closed.getInfo()
  assert.equal(closedInfo.allowInternetAccess, false, 'no egress unless asked for')
  assert.deepEqual(closedInfo.lifecycle, { onTimeout: 'kill', autoResume: false })

  // A sandbox with internet access keeps it when an update only adds a
  // denyOut: the update replaces the rules, it does not drop the base.
  const open = await newSandbox({ allowInternetAccess: true })
  assert.equal((await open.getInfo()).allowInternetAccess, true)
  await open.updateNetwork({ denyOut: [ip2] })
  assert.match(await reach(open, 'http://allowed.test/'), /host=allowed.test/)
  assert.doesNotMatch(await reach(open, 'http://second.test/'), /host=/)
  const openInfo = await open.getInfo()
  assert.equal(openInfo.allowInternetAccess, true)
  assert.deepEqual(openInfo.network.denyOut, [ip2])

  // E2B's "omitting fields clears them": an empty update lifts an allow
  // list, so everything (public) is reachable again.
  const listed = await newSandbox({ network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] } })
  assert.equal((await listed.getInfo()).allowInternetAccess, false)
  assert.doesNotMatch(await reach(listed, 'http://second.test/'), /host=/)
  await listed.updateNetwork({})
  assert.match(await reach(listed, 'http://second.test/'), /host=second.test/)
  assert.match(await reach(listed, 'http://other.test/'), /host=other.test/)
  const cleared = await listed.getInfo()
  assert.equal(cleared.allowInternetAccess, true)
  assert.equal(cleared.network.allowOut, undefined)
  assert.equal(cleared.network.denyOut, undefined)

  // allowInternetAccess: false in an update closes it again.
  await listed.updateNetwork({ allowInternetAccess: false })
  assert.doesNotMatch(await reach(listed, 'http://allowed.test/'), /host=/)
  assert.equal((await listed.getInfo()).allowInternetAccess, false)

  // Ingress settings are fixed at create.
  const r = await api('PUT', `/sandboxes/${listed.sandboxId}/network`, { body: { allowPublicTraffic: false } })
  assert.equal(r.status, 400)
  assert.match(r.body.message, /allowPublicTraffic/)
})

test('E2B routes Berth does not serve answer 501 naming what is missing, never 404', async () => {
  const sbx = await newSandbox()
  for (const [method, path] of [
    ['GET', '/templates'],
    ['DELETE', '/templates/team/base:v1'],
    ['GET', '/secrets'],
  ]) {
    const r = await api(method, path, { body: method === 'POST' ? {} : undefined })
    assert.equal(r.status, 501, `${method} ${path}: ${JSON.stringify(r.body)}`)
    assert.equal(r.body.code, 501)
    assert.match(r.body.message, /not implemented by Berth: ./)
  }
  // Through the SDK: an error that says so, not "not found".
  await assert.rejects(Secret.list().nextItems(), (err) => {
    assert.ok(!(err instanceof SandboxNotFoundError) && !(err instanceof NotFoundError), `got ${err.name}: ${err.message}`)
    assert.match(err.message, /not implemented by Berth/)
    return true
  })
  assert.equal(await sbx.isRunning(), true)
})

test('unknown fields are accepted; fields Berth cannot honour are refused by name', async () => {
  const ok = await api('POST', '/sandboxes', { body: { templateID: 'base', timeout: 30, someFutureField: { x: 1 } } })
  assert.equal(ok.status, 201, JSON.stringify(ok.body))
  assert.ok(ok.body.envdAccessToken)
  await api('DELETE', `/sandboxes/${ok.body.sandboxID}`)
  for (const [body, want] of [
    [{ templateID: 'base', mcp: { x: {} } }, /mcp/],
    [{ templateID: 'base', secure: false }, /secure: false/],
    [{ templateID: 'base', network: { maskRequestHost: 'x' } }, /maskRequestHost/],
    [{ templateID: 'nosuchtemplate' }, /nosuchtemplate/],
  ]) {
    const r = await api('POST', '/sandboxes', { body })
    assert.ok(r.status === 400 || r.status === 404, `${JSON.stringify(body)}: status ${r.status}`)
    assert.equal(r.body.code, r.status)
    assert.match(r.body.message, want)
  }
})

test('the README example runs as shown', async () => {
  const example = await readFile(new URL('./readme-example.mjs', import.meta.url), 'utf8')
  const readme = await readFile(new URL('../../README.md', import.meta.url), 'utf8')
  assert.ok(readme.includes(example), 'README.md must contain test/e2b/readme-example.mjs verbatim')
  const { stdout } = await promisify(execFile)(process.execPath, ['readme-example.mjs'], { cwd: new URL('.', import.meta.url) })
  assert.match(stdout, /^hello from berth-[a-z0-9]+\n/)
})
