// The SDK's Template() builder against Berth (driven by
// test/e2e/e2b_template_test.go, which serves a busybox image under a
// Docker Hub name through a loopback registry mirror and passes an admin
// key: template builds are the host's). Nothing here reaches beyond the
// machine: git, pip and npm install from files the build copied in.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { execFileSync } from 'node:child_process'
import { Template, Sandbox, BuildError, waitForFile } from 'e2b'
import { api } from './helpers.mjs'

const adminKey = process.env.E2B_ADMIN_API_KEY
const image = process.env.BERTH_TEST_IMAGE
const skip = !adminKey || !image ? 'needs E2B_ADMIN_API_KEY and BERTH_TEST_IMAGE: run through TestE2BTemplates' : false
const opts = { apiKey: adminKey }

const created = []
after(async () => {
  await Promise.all(created.map((s) => s.kill().catch(() => {})))
})

async function sandbox(template) {
  const sbx = await Sandbox.create(template, { timeoutMs: 300_000 })
  created.push(sbx)
  return sbx
}

// build is Template.build with the build's log in the error when it fails.
async function build(tpl, name, o = {}) {
  const logs = []
  try {
    return await Template.build(tpl, name, { ...opts, ...o, onBuildLogs: (l) => { logs.push(l.message); o.onBuildLogs?.(l) } })
  } catch (err) {
    // The SDK's BuildError carries the caller's stack, not its message:
    // say both.
    console.error(`build ${name} failed: ${err.message}\n--- build log ---\n${logs.join('\n')}`)
    throw err
  }
}

async function sh(sbx, cmd, user) {
  const r = await sbx.commands.run(cmd, user ? { user } : {})
  return r.stdout
}

// context is the build's file context: plain files, a directory, a git
// repository, a wheel and an npm package, all made here.
function context() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'berth-e2b-tpl-'))
  fs.writeFileSync(path.join(dir, 'hello.txt'), 'hello from the context\n')
  fs.mkdirSync(path.join(dir, 'dir'))
  fs.writeFileSync(path.join(dir, 'dir', 'a.txt'), 'a\n')
  fs.writeFileSync(path.join(dir, 'dir', 'b.txt'), 'b\n')
  fs.writeFileSync(path.join(dir, 'dir', 'ignored.log'), 'never uploaded\n')
  fs.writeFileSync(path.join(dir, '.dockerignore'), '**/*.log\n')
  // The SDK runs commands with /bin/bash -l -c; busybox has no bash.
  fs.writeFileSync(path.join(dir, 'bash'), '#!/bin/sh\n[ "$1" = -l ] && shift\nexec /bin/sh "$@"\n')
  // A repository to clone (file://, inside the build sandbox).
  const work = path.join(dir, 'work')
  fs.mkdirSync(work)
  const git = (...args) => execFileSync('git', ['-C', work, ...args], { env: { ...process.env, GIT_AUTHOR_NAME: 't', GIT_AUTHOR_EMAIL: 't@example.com', GIT_COMMITTER_NAME: 't', GIT_COMMITTER_EMAIL: 't@example.com' } })
  git('init', '-q', '-b', 'main')
  fs.writeFileSync(path.join(work, 'README'), 'cloned at build time\n')
  git('add', 'README')
  git('commit', '-q', '-m', 'first')
  execFileSync('git', ['clone', '-q', '--bare', work, path.join(dir, 'repo.git')])
  fs.rmSync(work, { recursive: true })
  // A wheel with no dependencies: pip installs it offline.
  execFileSync('python3', ['-c', `
import zipfile, sys
with zipfile.ZipFile(sys.argv[1], 'w') as z:
    z.writestr('berthdemo.py', 'ANSWER = 42\\n')
    z.writestr('berthdemo-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: berthdemo\\nVersion: 1.0\\n')
    z.writestr('berthdemo-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nGenerator: hand\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')
    z.writestr('berthdemo-1.0.dist-info/RECORD', '')
`, path.join(dir, 'berthdemo-1.0-py3-none-any.whl')])
  // An npm package with a bin and no dependencies.
  fs.mkdirSync(path.join(dir, 'npm-pkg'))
  fs.writeFileSync(path.join(dir, 'npm-pkg', 'package.json'), JSON.stringify({ name: 'berth-demo', version: '1.0.0', bin: { 'berth-demo': 'cli.js' } }))
  fs.writeFileSync(path.join(dir, 'npm-pkg', 'cli.js'), '#!/usr/bin/env node\nconsole.log("npm package ran")\n', { mode: 0o755 })
  return dir
}

const ctxDir = skip ? '' : context()
const suffix = Date.now().toString(36)
const imageName = `e2b-image-${suffix}`
const baseName = `e2b-base-${suffix}`

test('a template from an image (through the registry mirror) with every file and shell step', { skip }, async () => {
  const logs = []
  const tpl = Template({ fileContextPath: ctxDir })
    .fromImage(image)
    .copy('bash', '/bin/bash', { mode: 0o755 })
    .copy('hello.txt', '/app/hello.txt', { user: 'user', mode: 0o640 })
    .copy('dir', '/app/dir/')
    .runCmd('id -un > /tmp/whoami-default')
    .setUser('root')
    .setWorkdir('/app')
    .runCmd('id -un > whoami-root')
    .runCmd('id -un > /tmp/whoami-as', { user: 'user' })
    .setEnvs({ GREETING: 'hello from env', OTHER: 'x' })
    .runCmd('echo "$GREETING" > env-at-build')
    .makeSymlink('/app/hello.txt', '/app/link')
    .remove('/app/dir/b.txt')
    .rename('/app/dir/a.txt', '/app/dir/renamed.txt')
    .setUser('user')
    .setStartCmd('echo started > /tmp/started; sleep 3600', waitForFile('/tmp/started'))
  const info = await build(tpl, imageName, { onBuildLogs: (l) => logs.push(l.message) })
  assert.equal(info.name, imageName)
  assert.ok(logs.some((m) => /pulling .*berthtest-busybox/.test(m)), logs.join('\n'))
  assert.ok(logs.some((m) => /template .* built/.test(m)), logs.join('\n'))
  assert.equal(await Template.exists(imageName, opts), true)
  assert.equal(await Template.exists(`no-such-${suffix}`, opts), false)

  const sbx = await sandbox(imageName)
  assert.equal(await sh(sbx, 'cat /tmp/started'), 'started\n') // the start command ran before ready
  assert.equal(await sh(sbx, 'cat /app/hello.txt'), 'hello from the context\n')
  assert.equal(await sh(sbx, "stat -c '%U %a' /app/hello.txt"), 'user 640\n')
  assert.equal(await sh(sbx, 'ls /app/dir'), 'renamed.txt\n')
  assert.equal(await sh(sbx, 'readlink /app/link'), '/app/hello.txt\n')
  assert.equal(await sh(sbx, 'cat /tmp/whoami-default /app/whoami-root /tmp/whoami-as'), 'user\nroot\nuser\n')
  assert.equal(await sh(sbx, 'cat /app/env-at-build'), 'hello from env\n')
  assert.equal(await sh(sbx, 'echo "$GREETING"'), 'hello from env\n')
  // .dockerignore's *.log was never uploaded.
  assert.equal(await sh(sbx, 'test -e /app/dir/ignored.log || echo none'), 'none\n')

  // Unchanged steps come from the step cache. The uploads went when the
  // first build ended, so they are sent again; the same files are the
  // same cache key.
  const again = []
  await build(tpl, imageName, { onBuildLogs: (l) => again.push(l.message) })
  assert.ok(again.filter((m) => m.includes('CACHED')).length >= 8, again.join('\n'))
  assert.ok(again.some((m) => /Uploaded 'hello.txt'/.test(m)), again.join('\n'))
})

test('a template from E2B\'s base image: git clone, pip and npm install, tags', { skip }, async () => {
  const tpl = Template({ fileContextPath: ctxDir })
    .fromBaseImage()
    .copy('repo.git', '/src/repo.git/', { user: 'user' })
    .copy('berthdemo-1.0-py3-none-any.whl', '/src/')
    .copy('npm-pkg', '/src/npm-pkg/')
    .setEnvs({ NPM_CONFIG_UPDATE_NOTIFIER: 'false', NPM_CONFIG_AUDIT: 'false', NPM_CONFIG_FUND: 'false' })
    // The copied repository is root's (its directory is made like a parent).
    .runCmd("git config --global --add safe.directory '*'")
    .gitClone('file:///src/repo.git', '/home/user/repo', { branch: 'main', depth: 1 })
    .pipInstall('/src/berthdemo-1.0-py3-none-any.whl')
    .npmInstall('/src/npm-pkg', { g: true })
  const info = await build(tpl, `${baseName}:v1`, { tags: ['latest'] })
  assert.deepEqual([...info.tags].sort(), ['latest', 'v1'])
  assert.equal(await Template.exists(`${baseName}:v1`, opts), true)

  const sbx = await sandbox(`${baseName}:v1`)
  assert.equal(await sh(sbx, 'cat /home/user/repo/README'), 'cloned at build time\n')
  assert.equal(await sh(sbx, "stat -c '%U' /home/user/repo"), 'user\n')
  assert.equal(await sh(sbx, 'python -c "import berthdemo; print(berthdemo.ANSWER)"'), '42\n')
  assert.equal(await sh(sbx, 'berth-demo'), 'npm package ran\n')

  // Tags: assign, list, create by tag, remove.
  await Template.assignTags(`${baseName}:v1`, ['stable', 'default'], opts)
  const tags = (await Template.getTags(baseName, opts)).map((t) => t.tag).sort()
  assert.deepEqual(tags, ['default', 'latest', 'stable', 'v1'])
  const byTag = await sandbox(`${baseName}:stable`)
  assert.equal(await sh(byTag, 'cat /home/user/repo/README'), 'cloned at build time\n')
  const byName = await sandbox(baseName) // the default tag
  assert.equal(await sh(byName, 'python -c "import berthdemo; print(berthdemo.ANSWER)"'), '42\n')
  await Template.removeTags(baseName, 'stable', opts)
  assert.deepEqual((await Template.getTags(baseName, opts)).map((t) => t.tag).sort(), ['default', 'latest', 'v1'])
  assert.equal(await Template.exists(`${baseName}:stable`, opts), false)
})

test('fromTemplate builds on another template; a failing step names itself', { skip }, async () => {
  const child = Template().fromTemplate(imageName).runCmd('echo child > /tmp/child')
  await build(child, `${imageName}-child`)
  const sbx = await sandbox(`${imageName}-child`)
  assert.equal(await sh(sbx, 'cat /tmp/child /app/hello.txt'), 'child\nhello from the context\n')

  const bad = Template().fromTemplate(imageName).runCmd('echo before').runCmd('echo boom >&2; exit 3')
  await assert.rejects(Template.build(bad, `${imageName}-bad`, opts), (err) => {
    assert.ok(err instanceof BuildError, `${err.name}: ${err.message}`)
    assert.match(err.message, /step 2: RUN echo boom.*exit status 3/s)
    return true
  })
  assert.equal(await Template.exists(`${imageName}-bad`, opts), false)
})

// stepCache reads a build log: for each step number, whether it came
// from the cache (Berth logs "#N/T [step K] …" then "---> CACHED" or
// "---> done").
function stepCache(logs) {
  const out = {}
  let step = null
  for (const m of logs) {
    const at = /\[step (\d+)\]/.exec(m)
    if (at) step = Number(at[1])
    else if (step !== null && /^---> CACHED/.test(m)) out[step] = true
    else if (step !== null && /^---> done/.test(m)) out[step] = false
  }
  return out
}

test('skipCache() rebuilds from where it is set on; the steps before come from the cache', { skip }, async () => {
  const name = `${imageName}-skipcache`
  const plain = () => Template().fromTemplate(imageName)
    .runCmd('echo one > /tmp/one').runCmd('cat /proc/sys/kernel/random/uuid > /tmp/two').runCmd('echo three > /tmp/three')
  await build(plain(), name)
  const first = await sandbox(name)
  const stamp = await sh(first, 'cat /tmp/two')

  const logs = []
  const skipping = Template().fromTemplate(imageName)
    .runCmd('echo one > /tmp/one').skipCache().runCmd('cat /proc/sys/kernel/random/uuid > /tmp/two').runCmd('echo three > /tmp/three')
  await build(skipping, name, { onBuildLogs: (l) => logs.push(l.message) })
  assert.deepEqual(stepCache(logs), { 1: true, 2: false, 3: false }, logs.join('\n'))
  const again = await sandbox(name)
  assert.notEqual(await sh(again, 'cat /tmp/two'), stamp) // step 2 really ran again

  // Without skipCache(), the same steps are all cached again.
  const cached = []
  await build(plain(), name, { onBuildLogs: (l) => cached.push(l.message) })
  assert.deepEqual(stepCache(cached), { 1: true, 2: true, 3: true }, cached.join('\n'))
})

test('steps that need the internet fail under the build network, naming what it denied', { skip }, async () => {
  const apt = Template().fromBaseImage().aptInstall('cowsay')
  await assert.rejects(Template.build(apt, `${baseName}-apt`, opts), (err) => {
    assert.ok(err instanceof BuildError, `${err.name}: ${err.message}`)
    assert.match(err.message, /step 1: RUN apt-get update/)
    // With no build_network hosts, even the lookup is refused: the
    // message names the resolver's address it was refused at.
    assert.match(err.message, /exit status 100 \(the build network denied [^)]*:53; build_network/)
    return true
  })
})

test('user can sudo in an E2B sandbox, as on E2B\'s base image', { skip }, async () => {
  const sbx = await sandbox('base')
  assert.equal(await sh(sbx, 'whoami'), 'user\n')
  assert.equal(await sh(sbx, 'sudo -n id -u'), '0\n')
  // apt-get as the SDK's users run it (the install itself needs a mirror).
  assert.equal(await sh(sbx, 'sudo -n test -w /var/lib/dpkg && echo writable'), 'writable\n')
})

test('template builds need an admin key; what Berth lacks answers 501', { skip }, async () => {
  await assert.rejects(Template.build(Template().fromBaseImage(), `${baseName}-nokey`), /admin API key/)
  const withCreds = Template().fromImage(image, { username: 'u', password: 'p' })
  await assert.rejects(Template.build(withCreds, `${baseName}-creds`, opts), /berth registry login/)
  const r = await api('GET', '/templates', { key: adminKey })
  assert.equal(r.status, 501)
  // A daemon's wording, or the Kubernetes gateway's.
  assert.match(r.body.message, /not implemented by Berth|not served by the Kubernetes gateway/)
})
