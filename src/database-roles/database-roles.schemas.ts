import { Type, type Static } from 'typebox'
import { Uuid } from '../lib/openapi.ts'
import { DATABASE_ROLE_PRIVILEGES, ROLE_NAME_PATTERN } from '../lib/pg-role-name.ts'

/**
 * What `gatehouse db-user` and `users create|delete --db-user` report after
 * PostgreSQL has made the change: gatehouse holds no credential for the
 * service's database, so the CLI that does tells it (docs/cli.md).
 */
export const DatabaseRoleChange = Type.Object({
  action: Type.Union([Type.Literal('created'), Type.Literal('dropped')], { description: 'What was done to the role.' }),
  role: Type.String({ minLength: 1, maxLength: 63, pattern: ROLE_NAME_PATTERN, description: 'The role\'s name, as `gatehouse db-user` accepts it.' }),
  privileges: Type.Optional(Type.Array(Type.Union([Type.Literal('superuser'), Type.Literal('createdb'), Type.Literal('createrole'), Type.Literal('login')]), {
    maxItems: DATABASE_ROLE_PRIVILEGES.length,
    uniqueItems: true,
    description: 'For `created` (and only then): the role\'s privileges; `login` is always among them.'
  })),
  database: Type.String({
    minLength: 1,
    maxLength: 300,
    pattern: '^[^\\s@]+$',
    description: 'Where: the service database\'s host, port and name (`db.example.internal:5432/pipeline`), never a URL with a user or password.'
  }),
  user_id: Type.Optional(Uuid({ description: 'The gatehouse user the role belongs to, when the change came with one (`users create|delete --db-user`).' }))
}, { $id: 'DatabaseRoleChange', additionalProperties: false })
export type DatabaseRoleChange = Static<typeof DatabaseRoleChange>
