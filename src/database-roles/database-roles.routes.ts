import type { FastifyTypeBox } from '../lib/http.ts'
import { requestContext } from '../auth/auth.plugin.ts'
import { problems, ref, SECURITY } from '../lib/openapi.ts'
import { Event } from '../events/events.schemas.ts'
import { toEvent } from '../events/events.service.ts'
import { DatabaseRoleChange } from './database-roles.schemas.ts'
import { recordDatabaseRoleChange } from './database-roles.service.ts'

export default async function databaseRolesRoutes (app: FastifyTypeBox): Promise<void> {
  app.post('/api/database-roles/changes', {
    schema: {
      tags: ['events'],
      security: SECURITY,
      operationId: 'record_database_role_change',
      summary: 'Record a Database Role Change',
      description: 'How `gatehouse db-user` and `users create|delete --db-user` put a role they created or dropped in the service\'s PostgreSQL database ' +
        'into the audit trail: an event `database_role.created` or `database_role.dropped`, whose actor is the calling key. ' +
        'gatehouse holds no credential for that database and does not check the report against it (docs/cli.md).',
      body: ref(DatabaseRoleChange),
      response: { 201: { ...ref(Event), description: 'The event recorded.' }, ...problems(401, 403, 415, 422, 503) }
    },
    config: { scope: 'admin', accepts: ['application/json'] }
  }, async (request, reply) => {
    const row = await recordDatabaseRoleChange(app.db, requestContext(request), request.body)
    return await reply.code(201).send(toEvent(row))
  })
}
