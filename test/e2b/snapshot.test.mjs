// Snapshots and fork through the unchanged SDK: createSnapshot,
// listSnapshots, Sandbox.create(snapshotId), deleteSnapshot, fork. Berth
// maps them onto its own snapshots (internal/e2bcompat/snapshots.go); a
// key sees only its own.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, SandboxNotFoundError } from 'e2b'
import { newSandbox } from './helpers.mjs'

const other = { apiKey: process.env.E2B_API_KEY_2 }

// listAll reads every page of a snapshot listing.
async function listAll(opts = {}) {
  const pager = Sandbox.listSnapshots(opts)
  const out = []
  while (pager.hasNext) out.push(...(await pager.nextItems()))
  return out
}

test('snapshot: create, start a sandbox from it with the file, list, delete', async () => {
  const sbx = await newSandbox()
  await sbx.files.write('/home/user/note', 'written before the snapshot')
  const snap = await sbx.createSnapshot({ name: 'before-change' })
  assert.ok(snap.snapshotId, 'a snapshot ID')
  assert.deepEqual(snap.names, ['before-change'])
  // The source keeps running, and what it writes afterwards is not in
  // the snapshot.
  await sbx.files.write('/home/user/note', 'written after the snapshot')

  const restored = await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000 })
  try {
    assert.notEqual(restored.sandboxId, sbx.sandboxId)
    assert.equal(await restored.files.read('/home/user/note'), 'written before the snapshot')
    const r = await restored.commands.run('cat /home/user/note')
    assert.equal(r.stdout, 'written before the snapshot')
  } finally {
    await restored.kill()
  }

  const mine = await listAll()
  assert.ok(mine.some((s) => s.snapshotId === snap.snapshotId), 'listed')
  const bySource = await sbx.listSnapshots().nextItems()
  assert.deepEqual(bySource.map((s) => s.snapshotId), [snap.snapshotId], 'listed by its sandbox')
  const byName = await listAll({ name: 'before-change' })
  assert.ok(byName.every((s) => s.names.includes('before-change')) && byName.some((s) => s.snapshotId === snap.snapshotId))
  const paged = await Sandbox.listSnapshots({ limit: 1 }).nextItems()
  assert.equal(paged.length, 1)

  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false, 'a deleted snapshot is not found')
  assert.ok(!(await listAll()).some((s) => s.snapshotId === snap.snapshotId), 'no longer listed')
  await assert.rejects(Sandbox.create(snap.snapshotId, { timeoutMs: 30_000 }), 'no sandbox from a deleted snapshot')
})

test('snapshot: another key neither sees, uses nor deletes it', { skip: !process.env.E2B_API_KEY_2 }, async () => {
  const sbx = await newSandbox()
  await assert.rejects(Sandbox.createSnapshot(sbx.sandboxId, other), SandboxNotFoundError)
  const snap = await sbx.createSnapshot()
  assert.deepEqual(snap.names, [])
  assert.ok(!(await listAll(other)).some((s) => s.snapshotId === snap.snapshotId), 'not listed for another key')
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, other), false, 'not found for another key')
  // For another key the ID names no snapshot, so no template either.
  await assert.rejects(Sandbox.create(snap.snapshotId, { ...other, timeoutMs: 30_000 }))
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
})

test('fork: live copies with their own identity and files, the parent keeps running', async () => {
  const parent = await newSandbox({ metadata: { role: 'parent' } })
  await parent.files.write('/home/user/shared', 'from the parent')
  const forks = await parent.fork({ count: 2, timeoutMs: 120_000 })
  assert.equal(forks.length, 2)
  for (const f of forks) assert.ok(f instanceof Sandbox, `fork failed: ${f}`)
  try {
    const [a, b] = forks
    const ids = new Set([parent.sandboxId, a.sandboxId, b.sandboxId])
    assert.equal(ids.size, 3, 'each copy has its own ID')
    assert.ok(await parent.isRunning(), 'the parent keeps running')
    for (const f of forks) {
      assert.equal(await f.files.read('/home/user/shared'), 'from the parent')
      const info = await Sandbox.getInfo(f.sandboxId)
      assert.equal(info.state, 'running')
      assert.deepEqual(info.metadata, { role: 'parent' })
    }
    // Independent: what one writes, neither the other nor the parent sees.
    await a.files.write('/home/user/shared', 'from copy a')
    await b.files.write('/home/user/only-b', 'b')
    assert.equal(await parent.files.read('/home/user/shared'), 'from the parent')
    assert.equal(await b.files.read('/home/user/shared'), 'from the parent')
    assert.equal(await a.files.exists('/home/user/only-b'), false)
    assert.equal(await parent.files.exists('/home/user/only-b'), false)
    await parent.files.write('/home/user/shared', 'parent changed')
    assert.equal(await a.files.read('/home/user/shared'), 'from copy a')
    // The fork's own snapshot is not among the caller's snapshots.
    assert.deepEqual(await parent.listSnapshots().nextItems(), [])
  } finally {
    await Promise.all(forks.map((f) => (f instanceof Sandbox ? f.kill() : null)))
  }
})

test('fork: of another key\'s sandbox is not found', { skip: !process.env.E2B_API_KEY_2 }, async () => {
  const sbx = await newSandbox()
  await assert.rejects(Sandbox.fork(sbx.sandboxId, other), SandboxNotFoundError)
})
