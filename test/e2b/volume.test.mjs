// Volumes through the unchanged SDK: Volume.create, getInfo, connect,
// list, destroy; the volume content API (list, makeDir, getInfo, exists,
// updateMetadata, readFile, writeFile, remove) with the volume's own
// token; volumeMounts on a sandbox create. Berth maps them onto its own
// volumes (internal/e2bcompat/volumes.go); a key sees only its own. The
// SDK sends content requests to E2B_VOLUME_API_URL, set here to the
// daemon's API like E2B_API_URL.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, Volume, VolumeNotFoundError, VolumePathNotFoundError, VolumeError } from 'e2b'
import { newSandbox, api } from './helpers.mjs'

process.env.E2B_VOLUME_API_URL = process.env.E2B_API_URL
const other = { apiKey: process.env.E2B_API_KEY_2 }

test('volume: files written through the API and by sandboxes, shared, kept after they end', async () => {
  const vol = await Volume.create('sdk-data')
  assert.ok(vol.volumeId && vol.token, 'an ID and a content token')
  assert.equal(vol.name, 'sdk-data')
  try {
    // The content API, with the volume's token only.
    const written = await vol.writeFile('/seed/hello.txt', 'from the API', { force: true, uid: 1000, gid: 1000 })
    assert.equal(written.type, 'file')
    assert.equal(written.path, '/seed/hello.txt')
    assert.equal(written.uid, 1000)
    assert.equal(written.size, 12)
    assert.equal(await vol.readFile('/seed/hello.txt'), 'from the API')
    const bytes = await vol.readFile('/seed/hello.txt', { format: 'bytes' })
    assert.equal(bytes.length, 12)
    assert.equal(await vol.exists('/seed'), true)
    assert.equal(await vol.exists('/nope'), false)
    await assert.rejects(vol.readFile('/nope'), VolumePathNotFoundError)
    const dir = await vol.makeDir('/a/b', { force: true, uid: 1000, gid: 1000, mode: 0o750 })
    assert.equal(dir.type, 'directory')
    assert.equal(dir.mode, 0o750)
    const entries = await vol.list('/', { depth: 2 })
    assert.deepEqual(entries.map((e) => e.path).sort(), ['/a', '/a/b', '/seed', '/seed/hello.txt'])
    assert.ok(entries.every((e) => e.mtime instanceof Date))
    const changed = await vol.updateMetadata('/seed/hello.txt', { mode: 0o600 })
    assert.equal(changed.mode, 0o600)

    // A sandbox binding it sees the files, owned by its user, and writes
    // its own; a second sandbox sees them at once.
    const sbx = await newSandbox({ volumeMounts: { '/mnt/data': vol } })
    const info = await sbx.getInfo()
    assert.deepEqual(info.volumeMounts, [{ name: 'sdk-data', path: '/mnt/data' }])
    const r = await sbx.commands.run('cat /mnt/data/seed/hello.txt; stat -c %U /mnt/data/seed/hello.txt; echo from-sandbox > /mnt/data/out.txt')
    assert.equal(r.stdout, 'from the APIuser\n')
    const second = await newSandbox({ volumeMounts: { '/data': 'sdk-data' } })
    assert.equal((await second.commands.run('cat /data/out.txt')).stdout, 'from-sandbox\n')
    assert.equal(await vol.readFile('/out.txt'), 'from-sandbox\n')
    const out = await vol.getInfo('/out.txt')
    assert.equal(out.uid, 1000, 'written by the sandbox\'s user')

    // Bound: the destroy is refused, and says why.
    await assert.rejects(Volume.destroy(vol.volumeId), (err) => {
      assert.ok(err instanceof VolumeError, `got ${err.name}`)
      assert.match(err.message, /bound in sandbox/)
      return true
    })
    await sbx.kill()
    await second.kill()

    // Kept after the sandboxes end, for the next one.
    const third = await newSandbox({ volumeMounts: { '/work': vol } })
    assert.equal((await third.commands.run('cat /work/out.txt')).stdout, 'from-sandbox\n')
    await third.kill()

    // Through connect and list.
    const again = await Volume.connect(vol.volumeId)
    assert.equal(again.name, 'sdk-data')
    assert.equal(await again.readFile('/out.txt'), 'from-sandbox\n')
    assert.ok((await Volume.list()).some((v) => v.volumeId === vol.volumeId && v.name === 'sdk-data'))

    await vol.remove('/a')
    assert.equal(await vol.exists('/a/b'), false)
    await assert.rejects(vol.remove('/a'), VolumePathNotFoundError)
  } finally {
    await Volume.destroy(vol.volumeId).catch(() => {})
  }
  assert.equal(await Volume.destroy(vol.volumeId), false, 'gone')
  await assert.rejects(Volume.getInfo(vol.volumeId), VolumeNotFoundError)
})

test('volume: another key sees nothing, a wrong token reads nothing, bad input is refused by name', async () => {
  const vol = await Volume.create('sdk-private')
  try {
    await assert.rejects(Volume.getInfo(vol.volumeId, other), VolumeNotFoundError)
    assert.ok(!(await Volume.list(other)).some((v) => v.volumeId === vol.volumeId))
    assert.equal(await Volume.destroy(vol.volumeId, other), false)
    await assert.rejects(Sandbox.create('base', { ...other, volumeMounts: { '/x': 'sdk-private' } }), /sdk-private/)
    const forged = new Volume(vol.volumeId, vol.name, 'not-the-token', vol.domain)
    await assert.rejects(forged.list('/'), (err) => {
      assert.match(err.message, /volume's token/, `got ${err.name}: ${err.message}`)
      return true
    })
    // Paths never leave the volume.
    await assert.rejects(vol.readFile('/../../etc/passwd'), VolumeError)
    const r = await api('POST', '/volumes', { body: { name: '../bad' } })
    assert.equal(r.status, 400)
    assert.match(r.body.message, /name/)
    const dup = await api('POST', '/volumes', { body: { name: 'sdk-private' } })
    assert.equal(dup.status, 409)
    await assert.rejects(Sandbox.create('base', { volumeMounts: { '/proc/x': vol } }), /path/)
  } finally {
    await Volume.destroy(vol.volumeId)
  }
})
