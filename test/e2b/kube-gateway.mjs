// The npm e2b SDK against two replicas of the Kubernetes gateway (berth
// serve --kubernetes), driven by test/kube/e2b_test.go: E2B_API_URL and
// E2B_SANDBOX_URL are gateway A, BERTH_GATEWAY_B_URL is gateway B, and
// E2B_API_KEY_2 is a second key. Not named *.test.mjs: the daemon's run of
// this directory (test/e2e) does not take it.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError } from 'e2b'

const gatewayB = process.env.BERTH_GATEWAY_B_URL
if (!gatewayB) throw new Error('BERTH_GATEWAY_B_URL is not set: run this through test/kube/e2b_test.go')
const viaB = { apiUrl: gatewayB, sandboxUrl: gatewayB }

test('kube gateway: create through A, run and write through A and B, list and kill through B', async () => {
  const sbx = await Sandbox.create('base', {
    timeoutMs: 300_000, allowInternetAccess: false,
    metadata: { suite: 'kube-gateway' }, envs: { GREETING: 'hello from the gateway' },
  })
  // Commands: stdout, stderr, exit codes, the sandbox's env, E2B's user.
  const r = await sbx.commands.run('echo "$GREETING"; echo oops >&2; whoami; pwd')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello from the gateway\nuser\n/home/user\n')
  assert.equal(r.stderr, 'oops\n')
  await assert.rejects(sbx.commands.run('echo partial; exit 7'), (err) => {
    assert.ok(err instanceof CommandExitError, `got ${err}`)
    assert.equal(err.exitCode, 7)
    assert.equal(err.stdout, 'partial\n')
    return true
  })
  assert.equal((await sbx.commands.run('sudo -n whoami')).stdout, 'root\n', 'E2B sandboxes let "user" sudo')
  // Output streams as it comes, through the gateway and the node.
  const seen = []
  await sbx.commands.run('for i in 1 2 3; do echo line$i; done', { onStdout: (d) => seen.push(d) })
  assert.equal(seen.join(''), 'line1\nline2\nline3\n')

  // Files.
  await sbx.files.write('/home/user/hello.txt', 'hello, gateway')
  assert.equal(await sbx.files.read('/home/user/hello.txt'), 'hello, gateway')
  const big = 'x'.repeat(3 << 20)
  await sbx.files.write('/tmp/big.txt', big)
  assert.equal((await sbx.files.read('/tmp/big.txt')).length, big.length)
  assert.ok((await sbx.files.list('/home/user')).some((e) => e.name === 'hello.txt'))

  // Gateway B reaches the same sandbox: connect hands out the same token
  // (every replica derives it from the shared key).
  const again = await Sandbox.connect(sbx.sandboxId, viaB)
  assert.equal(again.sandboxId, sbx.sandboxId)
  assert.equal(await again.files.read('/home/user/hello.txt'), 'hello, gateway')
  assert.equal((await again.commands.run('cat /home/user/hello.txt')).stdout, 'hello, gateway')
  await assert.rejects(Sandbox.connect(sbx.sandboxId, { ...viaB, apiKey: process.env.E2B_API_KEY_2 }), "another key cannot connect")

  // Signed URLs: the gateway checks the signature (with the token it
  // derives) and the file goes through the node. The SDK builds them
  // against E2B_SANDBOX_URL (gateway A), naming no sandbox.
  const up = await sbx.uploadUrl('/tmp/signed.txt', { useSignatureExpiration: 120 })
  const form = new FormData()
  form.append('file', new Blob(['signed upload']), 'signed.txt')
  const put = await fetch(up, { method: 'POST', body: form })
  assert.equal(put.status, 200, await put.clone().text())
  assert.equal(await again.files.read('/tmp/signed.txt'), 'signed upload')
  const down = new URL(await sbx.downloadUrl('/tmp/signed.txt'))
  const viaBURL = new URL(down.pathname + down.search, gatewayB)
  const get = await fetch(viaBURL, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId } })
  assert.equal(get.status, 200)
  assert.equal(await get.text(), 'signed upload')
  const forged = await fetch(down.href.replace('signed.txt', 'other.txt'))
  assert.equal(forged.status, 401)

  // The egress policy changes through B: the pod's annotation, which the
  // node applies; getInfo reports E2B's settings.
  await Sandbox.updateNetwork(sbx.sandboxId, { allowOut: ['pypi.org'], denyOut: ['0.0.0.0/0'] }, viaB)
  const netInfo = await Sandbox.getInfo(sbx.sandboxId)
  assert.deepEqual(netInfo.network.allowOut, ['pypi.org'])
  assert.equal(netInfo.allowInternetAccess, false)
  await assert.rejects(sbx.updateNetwork({ allowOut: ['bad domain!'] }), /bad domain/)
  assert.deepEqual((await Sandbox.getInfo(sbx.sandboxId)).network.allowOut, ['pypi.org'])

  // Listing and info through B; the second key sees none of it.
  const listed = await Sandbox.list({ ...viaB, query: { metadata: { suite: 'kube-gateway' } } }).nextItems()
  assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])
  assert.equal(listed[0].state, 'running')
  const info = await Sandbox.getInfo(sbx.sandboxId, viaB)
  assert.equal(info.metadata.suite, 'kube-gateway')
  assert.equal(info.templateId, 'base')
  // The timeout moves through B (the pod's deadline annotation, which the
  // node follows); A's cache reports the new end once its watch has it.
  const asked = Date.now()
  await Sandbox.setTimeout(sbx.sandboxId, 1_800_000, viaB)
  let endAt = info.endAt
  for (const until = Date.now() + 60_000; endAt.getTime() < asked + 1_800_000 && Date.now() < until;) {
    await new Promise((resolve) => setTimeout(resolve, 50))
    endAt = (await Sandbox.getInfo(sbx.sandboxId)).endAt
  }
  assert.ok(endAt.getTime() >= asked + 1_800_000, `endAt ${endAt.toISOString()} after setTimeout(30 min) at ${new Date(asked).toISOString()}`)
  await sbx.setTimeout(600_000) // and back, through A
  await assert.rejects(Sandbox.setTimeout(sbx.sandboxId, 60_000, { ...viaB, apiKey: process.env.E2B_API_KEY_2 }), "another key cannot move the sandbox's timeout")
  const theirs = await Sandbox.list({ ...viaB, apiKey: process.env.E2B_API_KEY_2 }).nextItems()
  assert.deepEqual(theirs, [])
  assert.equal(await Sandbox.kill(sbx.sandboxId, { ...viaB, apiKey: process.env.E2B_API_KEY_2 }), false, "another key's sandbox is not found")

  // Kill through B; A finds it gone.
  assert.equal(await Sandbox.kill(sbx.sandboxId, viaB), true)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
})

test('kube gateway: pause() through A, listed paused through B, connect() through B resumes with the files kept', async () => {
  const sbx = await Sandbox.create('base', { timeoutMs: 300_000, allowInternetAccess: false, envs: { KEPT: 'env kept' } })
  await sbx.files.write('/home/user/note', 'written before the pause')
  assert.equal(await sbx.pause(), true)
  assert.equal(await sbx.pause(), false, 'pausing a paused sandbox reports it was paused already')
  assert.equal((await Sandbox.getInfo(sbx.sandboxId, viaB)).state, 'paused')
  const paused = await Sandbox.list({ ...viaB, query: { state: ['paused'] } }).nextItems()
  assert.ok(paused.some((s) => s.sandboxId === sbx.sandboxId), 'listed with state=paused through B')
  const running = await Sandbox.list({ ...viaB, query: { state: ['running'] } }).nextItems()
  assert.ok(!running.some((s) => s.sandboxId === sbx.sandboxId), 'not listed with state=running')

  const again = await Sandbox.connect(sbx.sandboxId, { ...viaB, timeoutMs: 120_000 })
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running')
  assert.equal(await again.files.read('/home/user/note'), 'written before the pause')
  assert.equal((await again.commands.run('echo "$KEPT"')).stdout, 'env kept\n')
  await again.kill()
})
