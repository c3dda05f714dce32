#!/usr/bin/env node
// The `gatehouse` command: runs the TypeScript CLI through tsx (a runtime dependency).
import { register } from 'tsx/esm/api'

register()
const { main } = await import('../src/cli/main.ts')
process.exitCode = await main(process.argv.slice(2))
