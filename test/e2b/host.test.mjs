// sandbox.getHost: a server inside the sandbox answers through the daemon,
// routed by the "<port>-<id>.<domain>" Host header.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { lookup } from 'node:dns/promises'
import { newSandbox, waitFor, domain } from './helpers.mjs'

const daemon = new URL(process.env.E2B_API_URL)

// get sends a request to the daemon with the given Host header (the preview
// domain does not resolve on the test machine).
function get(host, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: daemon.hostname, port: daemon.port, path: '/hello.txt', headers: { Host: host, ...headers } }, (res) => {
      let body = ''
      res.on('data', (c) => { body += c })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

test('getHost reaches an HTTP server started in the sandbox', async () => {
  const sbx = await newSandbox()
  await sbx.files.write('/home/user/www/hello.txt', 'served from inside')
  await sbx.commands.run('python3 -m http.server 8080 --directory /home/user/www', { background: true })
  const host = sbx.getHost(8080)
  assert.equal(host, `8080-${sbx.sandboxId}.${domain}`)
  const res = await waitFor('the server to answer', async () => {
    const r = await get(host)
    return r.status === 200 ? r : undefined
  })
  assert.equal(res.body, 'served from inside')
  // A port nothing listens on answers 502, like E2B's proxy.
  assert.equal((await get(sbx.getHost(8081))).status, 502)
})

test('allowPublicTraffic: false requires the traffic access token', async () => {
  const sbx = await newSandbox({ network: { allowPublicTraffic: false } })
  assert.ok(sbx.trafficAccessToken, 'create returns a trafficAccessToken')
  await sbx.files.write('/home/user/www/hello.txt', 'private')
  await sbx.commands.run('python3 -m http.server 8080 --directory /home/user/www', { background: true })
  const host = sbx.getHost(8080)
  const headers = { 'e2b-traffic-access-token': sbx.trafficAccessToken }
  const res = await waitFor('the server to answer', async () => {
    const r = await get(host, headers)
    return r.status === 200 ? r : undefined
  })
  assert.equal(res.body, 'private')
  assert.equal((await get(host)).status, 403)
  assert.equal((await get(host, { 'e2b-traffic-access-token': 'wrong' })).status, 403)
})

// The preview listener (port 80 in production; BERTH_PREVIEW_PORT here)
// serves getHost's name as it is, with no API port: Node resolves
// *.berth.localhost to loopback through nss (libnss-myhostname, installed
// by scripts/deps.sh) and fetch reaches the server in the sandbox.
test('fetch reaches getHost(port) through the preview listener', { skip: !process.env.BERTH_PREVIEW_PORT && 'BERTH_PREVIEW_PORT is not set' }, async (t) => {
  const sbx = await newSandbox()
  const host = sbx.getHost(8080)
  try {
    await lookup(host)
  } catch (err) {
    t.skip(`${host} does not resolve here (${err.code}): install libnss-myhostname or run systemd-resolved`)
    return
  }
  await sbx.files.write('/home/user/www/hello.txt', 'previewed')
  await sbx.commands.run('python3 -m http.server 8080 --directory /home/user/www', { background: true })
  const url = `http://${host}:${process.env.BERTH_PREVIEW_PORT}/hello.txt`
  const body = await waitFor('the server to answer through the preview listener', async () => {
    const r = await fetch(url)
    return r.status === 200 ? r.text() : undefined
  })
  assert.equal(body, 'previewed')
  await sbx.kill()
  const gone = await fetch(url)
  assert.equal(gone.status, 502)
  assert.match(await gone.text(), /The sandbox was not found/)
})
