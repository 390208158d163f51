// Output is never lost through the E2B SDK: the SDK's share of the stress
// test whose CLI and Go SDK parts are test/e2e/stress_test.go (5,000
// commands in all). Each command prints its own tokens on stdout and stderr
// and exits with its own code; every 50th prints 1 MiB and exits at once.
// The second batch runs under a CPU hog on every core of the host.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { cpus } from 'node:os'
import { CommandExitError } from 'e2b'
import { newSandbox } from './helpers.mjs'

const QUIET = 1400
const HOG = 200
const PARALLEL = 8
const BIG_EVERY = 50
const BIG = 1 << 20

// The first BIG bytes of `seq 1 200000`.
const big = (() => {
  const parts = []
  let len = 0
  for (let i = 1; len < BIG; i++) {
    const s = `${i}\n`
    parts.push(s)
    len += s.length
  }
  return parts.join('').slice(0, BIG)
})()

function stressCmd(prefix, n) {
  const tok = `${prefix}-${n}`
  if (n % BIG_EVERY === 0) {
    return { cmd: `echo o-${tok}; seq 1 200000 | head -c ${BIG}; echo e-${tok} >&2`, stdout: `o-${tok}\n${big}`, stderr: `e-${tok}\n`, code: 0 }
  }
  if (n % 3 === 0) {
    return { cmd: `echo o-${tok}`, stdout: `o-${tok}\n`, stderr: '', code: 0 }
  }
  const code = n % 5
  return { cmd: `echo o-${tok}; echo e-${tok} >&2; exit ${code}`, stdout: `o-${tok}\n`, stderr: `e-${tok}\n`, code }
}

function summarize(s) {
  return s.length <= 80 ? JSON.stringify(s) : `${s.length} chars ${JSON.stringify(s.slice(0, 20))}…${JSON.stringify(s.slice(-20))}`
}

async function runStress(sbx, prefix, count) {
  let next = 0
  const failures = []
  const worker = async () => {
    while (next < count) {
      const c = stressCmd(prefix, next++)
      let r
      try {
        r = await sbx.commands.run(c.cmd, { timeoutMs: 300_000 })
      } catch (err) {
        if (!(err instanceof CommandExitError)) {
          failures.push(`${c.cmd}: ${err}`)
          continue
        }
        r = err
      }
      if (r.stdout !== c.stdout || r.stderr !== c.stderr || r.exitCode !== c.code) {
        failures.push(`${c.cmd} = stdout ${summarize(r.stdout)}, stderr ${JSON.stringify(r.stderr)}, exit ${r.exitCode}; ` +
          `want stdout ${summarize(c.stdout)}, stderr ${JSON.stringify(c.stderr)}, exit ${c.code}`)
      }
    }
  }
  await Promise.all(Array.from({ length: PARALLEL }, worker))
  assert.equal(failures.length, 0, `${failures.length} of ${count} commands lost or garbled output or their exit code:\n${failures.slice(0, 20).join('\n')}`)
}

let sbx
before(async () => {
  sbx = await newSandbox({ timeoutMs: 900_000 })
})

const hogs = []
after(() => {
  for (const h of hogs) h.kill('SIGKILL')
})

test(`${QUIET} commands, ${PARALLEL} at a time: every byte and exit code`, { timeout: 600_000 }, async () => {
  await runStress(sbx, 'q', QUIET)
})

test(`${HOG} commands under a CPU hog on every core`, { timeout: 600_000 }, async () => {
  for (let i = 0; i < cpus().length; i++) {
    hogs.push(spawn('sh', ['-c', 'while :; do :; done'], { stdio: 'ignore' }))
  }
  try {
    await runStress(sbx, 'h', HOG)
  } finally {
    for (const h of hogs.splice(0)) h.kill('SIGKILL')
  }
})
