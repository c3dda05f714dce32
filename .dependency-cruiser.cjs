// The import rules of src/ (docs/architecture.md), checked by `npm run lint`
// (dependency-cruiser). Levels, lowest first:
//   data:     lib/, db/, errors.ts, config.ts, *.schemas.ts, *.repository.ts,
//             users/users.lifecycle.ts and the small leaf modules next to them
//   services: *.service.ts (rules, transactions, events of one feature)
//   flows:    sign-in/*.flow.ts (orchestrate several features)
//   top:      *.routes.ts, pages, *.plugin.ts, console/, cli/
//   root:     app.ts, imported only by the entry point (server.ts)
// test/architecture.test.ts breaks each rule in a copy of src/ and checks that it is caught.
const SERVICE = '\\.service\\.ts$'
const FLOW = '^src/sign-in/'
const TOP = '(\\.routes|\\.plugin|-pages?|\\.http)\\.ts$|^src/(console|cli|system)/|^src/sessions/(login-page|cookies)\\.ts$'
const ROOT = '^src/app\\.ts$'
const DATA = '^src/(lib|db)/|^src/(errors|config)\\.ts$|\\.(schemas|repository|lifecycle|types)\\.ts$'

module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      comment: 'No import cycles in src/: each module can be read, tested and changed from the modules below it.',
      severity: 'error',
      from: { path: '^src/' },
      to: { circular: true }
    },
    {
      name: 'services-never-import-services',
      comment: 'A service may use any feature\'s repositories and the user lifecycle, never another service; what needs several features is a flow (src/sign-in/).',
      severity: 'error',
      from: { path: SERVICE },
      to: { path: SERVICE }
    },
    {
      name: 'services-stay-below-flows-and-routes',
      severity: 'error',
      from: { path: SERVICE },
      to: { path: `${FLOW}|${TOP}|${ROOT}` }
    },
    {
      name: 'data-stays-at-the-bottom',
      comment: 'lib/, db/, repositories, schemas and the user lifecycle import nothing above them.',
      severity: 'error',
      from: { path: DATA },
      to: { path: `${SERVICE}|${FLOW}|${TOP}|${ROOT}` }
    },
    {
      name: 'flows-stay-below-routes',
      severity: 'error',
      from: { path: FLOW },
      to: { path: `${TOP}|${ROOT}` }
    },
    {
      name: 'only-the-entry-point-imports-app',
      comment: 'app.ts is the composition root: routes get what they need as plugin options and decorators, never from app.ts.',
      severity: 'error',
      from: { path: '^src/', pathNot: '^src/server\\.ts$' },
      to: { path: ROOT }
    }
  ],
  options: {
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    doNotFollow: { path: 'node_modules' },
    exclude: { path: 'node_modules' }
  }
}
