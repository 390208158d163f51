// files.* through the unchanged SDK.
import { test, before } from 'node:test'
import assert from 'node:assert/strict'
import { FileType, FilesystemEventType, NotFoundError } from 'e2b'
import { newSandbox, waitFor } from './helpers.mjs'

let sbx
before(async () => {
  sbx = await newSandbox()
})

test('write and read: text, bytes, blob, stream', async () => {
  const info = await sbx.files.write('/home/user/hello.txt', 'hello, world')
  assert.equal(info.path, '/home/user/hello.txt')
  assert.equal(info.name, 'hello.txt')
  assert.equal(await sbx.files.read('/home/user/hello.txt'), 'hello, world')
  const bytes = await sbx.files.read('/home/user/hello.txt', { format: 'bytes' })
  assert.deepEqual(Buffer.from(bytes), Buffer.from('hello, world'))
  const blob = await sbx.files.read('/home/user/hello.txt', { format: 'blob' })
  assert.equal(await blob.text(), 'hello, world')
  const stream = await sbx.files.read('/home/user/hello.txt', { format: 'stream' })
  const chunks = []
  for await (const c of stream) chunks.push(Buffer.from(c))
  assert.equal(Buffer.concat(chunks).toString(), 'hello, world')
  // Written as the default user. (find, not stat: coreutils' stat and ls
  // call statx with AT_NO_AUTOMOUNT, which gVisor's sentry before 2023
  // refuses; docs/security.md, gVisor.)
  const r = await sbx.commands.run('find /home/user/hello.txt -printf "%u\\n"')
  assert.equal(r.stdout, 'user\n')
  await assert.rejects(sbx.files.read('/home/user/missing'), NotFoundError)
})

test('write many and large files', async () => {
  const infos = await sbx.files.write([
    { path: '/tmp/many/a.txt', data: 'A' },
    { path: '/tmp/many/sub/b.bin', data: new Uint8Array([0, 1, 2, 255]) },
  ])
  assert.deepEqual(infos.map((i) => i.path).sort(), ['/tmp/many/a.txt', '/tmp/many/sub/b.bin'])
  assert.equal(await sbx.files.read('/tmp/many/a.txt'), 'A')
  assert.deepEqual([...(await sbx.files.read('/tmp/many/sub/b.bin', { format: 'bytes' }))], [0, 1, 2, 255])

  const big = Buffer.alloc(20 << 20)
  for (let i = 0; i < big.length; i += 4096) big[i] = i % 251
  await sbx.files.write('/tmp/big.bin', big)
  const r = await sbx.commands.run('find /tmp/big.bin -printf "%s\\n"')
  assert.equal(r.stdout, `${big.length}\n`)
  const back = Buffer.from(await sbx.files.read('/tmp/big.bin', { format: 'bytes' }))
  assert.ok(back.equals(big), 'large file read back differs')
})

test('list with depth, exists, getInfo, makeDir, rename, remove', async () => {
  assert.equal(await sbx.files.makeDir('/tmp/tree/a/b'), true)
  assert.equal(await sbx.files.makeDir('/tmp/tree/a/b'), false, 'makeDir of an existing dir reports false')
  await sbx.files.write('/tmp/tree/top.txt', 'top')
  await sbx.files.write('/tmp/tree/a/b/deep.txt', 'deep')
  const shallow = await sbx.files.list('/tmp/tree')
  assert.deepEqual(shallow.map((e) => e.name).sort(), ['a', 'top.txt'])
  const deep = await sbx.files.list('/tmp/tree', { depth: 3 })
  assert.deepEqual(deep.map((e) => e.path).sort(), ['/tmp/tree/a', '/tmp/tree/a/b', '/tmp/tree/a/b/deep.txt', '/tmp/tree/top.txt'])

  assert.equal(await sbx.files.exists('/tmp/tree/top.txt'), true)
  assert.equal(await sbx.files.exists('/tmp/tree/nope'), false)
  const fi = await sbx.files.getInfo('/tmp/tree/top.txt')
  assert.equal(fi.type, FileType.FILE)
  assert.equal(fi.size, 3)
  assert.equal(fi.owner, 'user')
  assert.equal((await sbx.files.getInfo('/tmp/tree/a')).type, FileType.DIR)

  const moved = await sbx.files.rename('/tmp/tree/top.txt', '/tmp/tree/a/moved.txt')
  assert.equal(moved.path, '/tmp/tree/a/moved.txt')
  assert.equal(await sbx.files.read('/tmp/tree/a/moved.txt'), 'top')
  assert.equal(await sbx.files.exists('/tmp/tree/top.txt'), false)
  await sbx.files.remove('/tmp/tree/a')
  assert.equal(await sbx.files.exists('/tmp/tree/a'), false)
})

test('as envd: remove of a missing path succeeds, symlink targets are absolute, metadata rides on user.e2b.* xattrs', async () => {
  await sbx.files.remove('/tmp/never-was')
  await sbx.files.remove('/tmp/never/was/either')

  await sbx.files.write('/tmp/links/target.txt', 'x')
  await sbx.commands.run('cd /tmp/links && ln -s target.txt rel && ln -s ../links/target.txt up && ln -s missing dangling')
  const rel = await sbx.files.getInfo('/tmp/links/rel')
  assert.equal(rel.type, FileType.SYMLINK)
  assert.equal(rel.symlinkTarget, '/tmp/links/target.txt')
  assert.equal((await sbx.files.getInfo('/tmp/links/up')).symlinkTarget, '/tmp/links/target.txt')
  assert.equal((await sbx.files.getInfo('/tmp/links/dangling')).symlinkTarget, '/tmp/links/missing')

  const written = await sbx.files.write('/tmp/meta/a.txt', 'with metadata', { metadata: { Owner: 'alice', stage: 'draft' } })
  assert.deepEqual(written.metadata, { owner: 'alice', stage: 'draft' }, 'keys come back lowercased, as envd stores them')
  const attr = await sbx.commands.run(`python3 -c "import os; print(os.getxattr('/tmp/meta/a.txt', 'user.e2b.owner').decode())"`)
  assert.equal(attr.stdout, 'alice\n')
  assert.deepEqual((await sbx.files.getInfo('/tmp/meta/a.txt')).metadata, { owner: 'alice', stage: 'draft' })
  // Set out of band, read like the rest.
  await sbx.commands.run(`python3 -c "import os; os.setxattr('/tmp/meta/a.txt', 'user.e2b.extra', b'1')"`)
  const listed = await sbx.files.list('/tmp/meta')
  assert.deepEqual(listed.map((e) => e.metadata), [{ owner: 'alice', stage: 'draft', extra: '1' }])
  const renamed = await sbx.files.rename('/tmp/meta/a.txt', '/tmp/meta/b.txt')
  assert.equal(renamed.metadata.owner, 'alice')
  // A write replaces the whole set; one without metadata clears it.
  const again = await sbx.files.write('/tmp/meta/b.txt', 'v2', { metadata: { stage: 'final' } })
  assert.deepEqual(again.metadata, { stage: 'final' })
  const plain = await sbx.files.write('/tmp/meta/b.txt', 'v3')
  assert.equal(plain.metadata, undefined)
  assert.equal((await sbx.files.getInfo('/tmp/meta/b.txt')).metadata, undefined)
  assert.equal((await sbx.files.getInfo('/tmp/links/target.txt')).metadata, undefined)
})

test('watchDir recursive reports creates, writes and removes', async () => {
  await sbx.files.makeDir('/tmp/watched/sub')
  const events = []
  const handle = await sbx.files.watchDir('/tmp/watched', (e) => events.push(e), { recursive: true })
  try {
    await sbx.files.write('/tmp/watched/sub/new.txt', 'x')
    await sbx.commands.run('echo more >> /tmp/watched/sub/new.txt; rm /tmp/watched/sub/new.txt')
    await waitFor('a remove event', () => events.some((e) => e.type === FilesystemEventType.REMOVE)).catch((err) => {
      throw new Error(`${err.message}; events so far: ${JSON.stringify(events)}`)
    })
  } finally {
    await handle.stop()
  }
  const forFile = events.filter((e) => e.name === 'sub/new.txt')
  const types = new Set(forFile.map((e) => e.type))
  assert.ok(types.has(FilesystemEventType.CREATE), `events ${JSON.stringify(events)}`)
  assert.ok(types.has(FilesystemEventType.WRITE), `events ${JSON.stringify(events)}`)
  assert.ok(types.has(FilesystemEventType.REMOVE), `events ${JSON.stringify(events)}`)
})

test('uploadUrl and downloadUrl carry signatures that work without the token', async () => {
  const up = await sbx.uploadUrl('/tmp/signed.txt')
  assert.match(up, /signature=v1_/)
  const form = new FormData()
  form.append('file', new Blob(['signed upload']), 'signed.txt')
  const put = await fetch(up, { method: 'POST', body: form, headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' } })
  assert.equal(put.status, 200, await put.clone().text())
  assert.equal(await sbx.files.read('/tmp/signed.txt'), 'signed upload')

  const down = await sbx.downloadUrl('/tmp/signed.txt')
  const get = await fetch(down, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId } })
  assert.equal(get.status, 200)
  assert.equal(await get.text(), 'signed upload')

  // A signature for another path is refused.
  const forged = down.replace('signed.txt', 'other.txt')
  const bad = await fetch(forged, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId } })
  assert.equal(bad.status, 401)
})

test('signed URLs built against E2B_SANDBOX_URL name no sandbox: the signature finds it', async () => {
  // The SDK builds these from E2B_SANDBOX_URL: /files?path=…&signature=…,
  // no sandbox ID, no header.
  const other = await newSandbox()
  await sbx.files.write('/tmp/bare.txt', 'mine')
  await other.files.write('/tmp/bare.txt', 'theirs')
  const down = await sbx.downloadUrl('/tmp/bare.txt')
  assert.ok(down.startsWith(process.env.E2B_SANDBOX_URL + '/files?'), down)
  assert.doesNotMatch(down, new RegExp(sbx.sandboxId))
  const get = await fetch(down)
  assert.equal(get.status, 200, await get.clone().text())
  assert.equal(await get.text(), 'mine')
  const theirs = await fetch(await other.downloadUrl('/tmp/bare.txt'))
  assert.equal(await theirs.text(), 'theirs')

  const up = await other.uploadUrl('/tmp/bare-up.txt', { useSignatureExpiration: 60 })
  const form = new FormData()
  form.append('file', new Blob(['uploaded bare']), 'bare-up.txt')
  const put = await fetch(up, { method: 'POST', body: form })
  assert.equal(put.status, 200, await put.clone().text())
  assert.equal(await other.files.read('/tmp/bare-up.txt'), 'uploaded bare')
  assert.equal(await sbx.files.exists('/tmp/bare-up.txt'), false)

  // Unknown and expired signatures keep their 401.
  const forged = await fetch(down.replace('bare.txt', 'other.txt'))
  assert.equal(forged.status, 401)
  const url = new URL(await sbx.downloadUrl('/tmp/bare.txt', { useSignatureExpiration: 1 }))
  const exp = Number(url.searchParams.get('signature_expiration'))
  assert.ok(exp > 0)
  // A signature whose expiry is in the past (made with the real token).
  const past = new URL(down)
  const { createHash } = await import('node:crypto')
  const stale = Math.floor(Date.now() / 1000) - 10
  past.searchParams.set('signature', 'v1_' + createHash('sha256').update(`/tmp/bare.txt:read::${sbx.envdAccessToken ?? ''}:${stale}`).digest('base64').replace(/=+$/, ''))
  past.searchParams.set('signature_expiration', String(stale))
  const expired = await fetch(past)
  assert.equal(expired.status, 401)
  assert.match((await expired.json()).message, /expired/)
})
