import { Sandbox } from 'e2b'
const sandbox = await Sandbox.create('base')
const result = await sandbox.commands.run('echo hello from $(hostname)')
console.log(result.stdout)
await sandbox.kill()
