// Measures, through the official npm e2b SDK, the time from Sandbox.create
// to the result of the first commands.run('echo ok'), n times in a row, and
// prints {"durations_ms": [...]} on stdout. bench/main.go runs it with
// NODE_PATH=test/e2b/node_modules and the E2B_* variables set.
const { Sandbox } = require('e2b')

async function main() {
  const n = Number(process.argv[2] || '10')
  const template = process.argv[3] || 'base'
  const out = []
  for (let i = 0; i < n; i++) {
    const start = performance.now()
    const sbx = await Sandbox.create(template)
    const r = await sbx.commands.run('echo ok')
    const took = performance.now() - start
    if (r.stdout !== 'ok\n') throw new Error(`echo ok printed ${JSON.stringify(r.stdout)}`)
    out.push(took)
    await sbx.kill()
  }
  process.stdout.write(JSON.stringify({ durations_ms: out }) + '\n')
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
