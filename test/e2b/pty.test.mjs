// pty.* through the unchanged SDK.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { newSandbox, waitFor } from './helpers.mjs'

test('pty: create, sendInput, resize, kill', async () => {
  const sbx = await newSandbox()
  let out = ''
  const dec = new TextDecoder()
  const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) } })
  assert.ok(pty.pid > 0)
  const enc = new TextEncoder()
  await sbx.pty.sendInput(pty.pid, enc.encode('stty size; echo pty-$((6*7))\n'))
  await waitFor('the PTY to echo the command output', () => out.includes('pty-42'))
  assert.match(out, /24 80/)
  await sbx.pty.resize(pty.pid, { cols: 120, rows: 40 })
  await sbx.pty.sendInput(pty.pid, enc.encode('stty size\n'))
  await waitFor('the new size', () => out.includes('40 120'))
  // The shell is interactive: it runs as the default user on a terminal.
  await sbx.pty.sendInput(pty.pid, enc.encode('tty; whoami\n'))
  await waitFor('tty and whoami', () => /\/dev\/pts\/\d+/.test(out) && out.includes('user'))
  assert.equal(await sbx.pty.kill(pty.pid), true)
  await assert.rejects(pty.wait())
})

test('pty: Ctrl-C interrupts the foreground command, exit ends the PTY with its code', async () => {
  const sbx = await newSandbox()
  let out = ''
  const dec = new TextDecoder()
  const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) } })
  const enc = new TextEncoder()
  // The command prints once it is the foreground process (its own
  // process group, default SIGINT), so the Ctrl-C cannot race its start.
  await sbx.pty.sendInput(pty.pid, enc.encode(`sh -c 'echo sl""eeping; exec sleep 100'\n`))
  await waitFor('the foreground command to start', () => out.includes('sleeping\r\n'))
  await sbx.pty.sendInput(pty.pid, enc.encode('\x03'))
  await sbx.pty.sendInput(pty.pid, enc.encode("echo after-ctrl''c\n"))
  await waitFor('the shell to run the next line after Ctrl-C', () => out.includes('after-ctrlc'))
  await sbx.pty.sendInput(pty.pid, enc.encode('exit 3\n'))
  const res = await pty.wait().catch((e) => e)
  assert.equal(res.exitCode, 3)
})
