import { Type } from 'typebox'
import type { FastifyTypeBox } from '../lib/http.ts'
import { setNextLink } from '../lib/paging.ts'
import { problems, ref, SECURITY, withHeaders } from '../lib/openapi.ts'
import { Event, EVENTS_PAGE_MAX, ListEventsQuery } from './events.schemas.ts'
import { listEventsPage } from './events.service.ts'

export default async function eventsRoutes (app: FastifyTypeBox): Promise<void> {
  app.get('/api/events', {
    schema: {
      tags: ['events'],
      security: SECURITY,
      operationId: 'list_events',
      summary: 'List Events',
      description: 'The append-only record of every change, newest first. The next page is in the `Link: rel="next"` header.',
      querystring: ListEventsQuery,
      response: { 200: withHeaders({ ...Type.Array(ref(Event), { maxItems: EVENTS_PAGE_MAX }), description: 'Events, newest first.' }, 'Link'), ...problems(401, 403, 422, 503) }
    },
    config: { scope: 'events:read' }
  }, async (request, reply) => {
    const page = await listEventsPage(app.db, request.query)
    if (page.nextCursor !== undefined) setNextLink(request, reply, page.nextCursor)
    return page.events
  })
}
