import { ACCOUNT_SCHEMAS } from '../account/account.routes.ts'
import { ApiKey, ApiKeyCreate, ApiKeyWithSecret } from '../api-keys/api-keys.schemas.ts'
import { DatabaseRoleChange } from '../database-roles/database-roles.schemas.ts'
import { Event } from '../events/events.schemas.ts'
import { GROUP_SCHEMAS } from '../groups/groups.schemas.ts'
import { Problem } from '../lib/openapi.ts'
import { MFA_SCHEMAS } from '../mfa/mfa.schemas.ts'
import { SCIM_SCHEMAS } from '../scim/scim.schemas.ts'
import { LoginBody, PasswordChange, Session, SessionsEnded, SessionSummary } from '../sessions/sessions.schemas.ts'
import { SSO_SCHEMAS } from '../sso/oidc.schemas.ts'
import { Invitation, User, UserCreate, UserCreated, UserPatch } from '../users/users.schemas.ts'
import { WEBHOOK_SCHEMAS } from '../webhooks/webhooks.schemas.ts'

/** The schemas routes refer to by `$id`, added to the app once: they are the OpenAPI document's components. */
export const SHARED_SCHEMAS = [Problem, User, UserCreate, UserPatch, Invitation, UserCreated, ApiKey, ApiKeyCreate, ApiKeyWithSecret, Event, LoginBody, Session, PasswordChange, SessionSummary, SessionsEnded, ...MFA_SCHEMAS, ...SSO_SCHEMAS, ...ACCOUNT_SCHEMAS, ...GROUP_SCHEMAS, DatabaseRoleChange, ...SCIM_SCHEMAS, ...WEBHOOK_SCHEMAS]
