import { Type, type Static, type TSchema } from 'typebox'
import { patternInWords } from '../errors.ts'
import { Nullable, ref, Timestamp, Uuid } from '../lib/openapi.ts'

/** Letters, digits and . _ @ -; ASCII so case-folding means the same in every database and client. */
export const USERNAME_PATTERN = patternInWords('^[A-Za-z0-9._@-]{1,64}$', '1 to 64 characters: letters, digits, and . _ @ -')

const Username = Type.String({
  minLength: 1,
  maxLength: 64,
  pattern: USERNAME_PATTERN,
  description: 'Letters, digits and `._@-`; unique ignoring case; stored as given.',
  examples: ['ada.lovelace']
})
const Email = Type.String({ format: 'email', maxLength: 254, description: 'Unique ignoring case.', examples: ['ada@example.com'] })
const Name = Type.String({ maxLength: 200 })
const Role = Type.Union([Type.Literal('admin'), Type.Literal('user')], { description: 'Only an admin may set it.' })
const Group = Type.String({ minLength: 1, maxLength: 64 })
export const MAX_GROUPS = 100
const Groups = Type.Array(Group, { maxItems: MAX_GROUPS, uniqueItems: true, description: 'Labels the main service maps to permissions.' })
const Password = Type.String({
  minLength: 1,
  maxLength: 1024,
  format: 'password',
  writeOnly: true,
  description: 'Write-only: never returned. 8 to 256 characters, not common, not containing the username, the e-mail address\'s name part or the service\'s names (PASSWORD_CONTEXT_WORDS).'
})
const NullableTimestamp = Nullable(Timestamp())
const PasswordSignIn = Type.Boolean({
  description: 'Whether this user may sign in with a local password (default true). False: only single sign-on, LDAP or a passkey. ' +
    'PASSWORD_SIGN_IN=off turns password sign-in off for everyone, whatever this says. A user cannot change it for themselves.'
})

// Read back as written: the bounds of UserCreate hold for every stored user.
export const User = Type.Object({
  id: Uuid({ description: 'Server-assigned, immutable; the `user_id` of the other operations.' }),
  username: Username,
  email: Nullable(Email),
  first_name: Nullable(Name),
  last_name: Nullable(Name),
  role: Role,
  groups: Groups,
  disabled: Type.Boolean(),
  password_sign_in: PasswordSignIn,
  email_verified: Type.Boolean({ description: 'The address in `email` was confirmed by a link or code mailed to it (docs/email.md). Set false whenever `email` changes but by a confirmation.' }),
  invitation_pending: Type.Boolean({ description: 'Invited and not yet accepted (docs/email.md#invitations): the user cannot sign in with a password until the invitation link sets one.' }),
  created_at: Timestamp(),
  updated_at: Timestamp(),
  last_login_at: NullableTimestamp,
  password_changed_at: NullableTimestamp
}, { $id: 'User', additionalProperties: false, description: 'A person account of the web UI.' })
export type User = Static<typeof User>

/** The schema with an example value; Swagger UI fills form fields (Try it out) from these, one property at a time. */
function withExample<T extends TSchema> (schema: T, example: unknown): T {
  return { ...schema, examples: [example] }
}

/**
 * What Swagger UI's Try it out starts from: an ordinary, enabled user (the
 * schema alone would make it offer the first role, `admin`). No password: one
 * printed in the public document is one someone will use.
 */
const CREATE_EXAMPLE = {
  username: 'ada.lovelace',
  email: 'ada@example.com',
  first_name: 'Ada',
  last_name: 'Lovelace',
  role: 'user',
  groups: ['analysts'],
  disabled: false
} as const

export const UserCreate = Type.Object({
  username: Username,
  password: Type.Optional(Password),
  email: Type.Optional(Nullable(Email)),
  first_name: Type.Optional(withExample(Nullable(Name), CREATE_EXAMPLE.first_name)),
  last_name: Type.Optional(withExample(Nullable(Name), CREATE_EXAMPLE.last_name)),
  role: Type.Optional(withExample(Role, CREATE_EXAMPLE.role)),
  groups: Type.Optional(withExample(Groups, CREATE_EXAMPLE.groups)),
  disabled: Type.Optional(Type.Boolean({ examples: [CREATE_EXAMPLE.disabled] })),
  password_sign_in: Type.Optional(PasswordSignIn),
  invite: Type.Optional(Type.Boolean({
    description: 'Invite the user instead of giving a password (docs/email.md#invitations): the user is `invitation_pending` until they follow the ' +
      'mailed link (or, without SMTP, the link in this answer\'s `invitation`) and set their own password. Not with `password`; needs an `email` when mail is sent.'
  }))
}, {
  $id: 'UserCreate',
  additionalProperties: false,
  description: 'A new user. Unknown and read-only fields (`id`, timestamps, `password_hash`) are rejected with 422. ' +
    'Without a password the user exists but cannot sign in until one is set (the example has none: add your own).',
  examples: [CREATE_EXAMPLE]
})
export type UserCreate = Static<typeof UserCreate>

export const UserPatch = Type.Object({
  username: Type.Optional(Username),
  password: Type.Optional(Password),
  email: Type.Optional(Nullable(Email)),
  first_name: Type.Optional(Nullable(Name)),
  last_name: Type.Optional(Nullable(Name)),
  role: Type.Optional(Role),
  groups: Type.Optional(Groups),
  disabled: Type.Optional(Type.Boolean({ description: 'Disabling ends the user\'s API keys.' })),
  password_sign_in: Type.Optional(PasswordSignIn)
}, {
  $id: 'UserPatch',
  additionalProperties: false,
  description: 'A JSON merge patch (RFC 7396): fields present are set, `null` clears an optional field, absent fields stay.',
  // A harmless change for Try it out (from the schema alone it would promote, disable and set the password `********`).
  examples: [{ first_name: 'Ada', last_name: 'King', groups: ['analysts', 'ops'] }]
})
export type UserPatch = Static<typeof UserPatch>

export const SORTS = ['created_at', '-created_at', 'username', '-username', 'updated_at', '-updated_at'] as const
export type Sort = typeof SORTS[number]

export const ListUsersQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ format: 'int32', minimum: 1, maximum: 1000, description: 'Page size. Without it, every matching user is returned in one streamed array.' })),
  cursor: Type.Optional(Type.String({ maxLength: 1024, description: 'From the `Link: rel="next"` header of the previous page.' })),
  q: Type.Optional(Type.String({ minLength: 1, maxLength: 200, description: 'Substring of username, email, first or last name, ignoring case.' })),
  username: Type.Optional(Type.String({ maxLength: 64, description: 'Exact username, ignoring case.' })),
  email: Type.Optional(Type.String({ maxLength: 254, description: 'Exact email, ignoring case.' })),
  role: Type.Optional(Role),
  group: Type.Optional(Group),
  disabled: Type.Optional(Type.Boolean()),
  sort: Type.Optional(Type.Enum(SORTS, { default: 'created_at', description: 'Field to order by; `-` for descending.' }))
}, { additionalProperties: false })
export type ListUsersQuery = Static<typeof ListUsersQuery>

export const UserIdParams = Type.Object({
  user_id: Uuid({ description: 'The `id` of a user, as the list operation returns it.' })
})
export type UserIdParams = Static<typeof UserIdParams>

export const IfMatchHeaders = Type.Object({
  'if-match': Type.Optional(Type.String({ maxLength: 256, description: 'The `ETag` you read; the change is refused with 412 if the user changed since.' }))
})

/** The most users one import request takes; the CLI sends bigger files in batches of this size. */
export const IMPORT_MAX_USERS = 1000

const PasswordHash = Type.String({
  minLength: 1,
  maxLength: 512,
  writeOnly: true,
  description: 'An existing hash, as a PHC string: `$argon2id$`/`$argon2i$`/`$argon2d$` (v=19, m ≤ 1048576 KiB, t ≤ 10, p ≤ 16), ' +
    'bcrypt `$2a$`/`$2b$`/`$2y$` (cost 4 to 15), or `$scrypt$ln=<log2 N>,r=<r>,p=<p>$<salt>$<hash>` (base64, N ≤ 2^17, r ≤ 32, p ≤ 16). ' +
    'Stored as given and replaced by an argon2id hash at the user\'s next sign-in.',
  examples: ['$2b$12$R9h/cIPz0gi.URNNX3kh2OPST9/PgBkqquzi.Ss7KIUgO2t0jWMUW']
})

// An import creates users with a password, a hash or neither; inviting is one user at a time.
const { invite: _invite, ...importableProperties } = UserCreate.properties

export const UserImportItem = Type.Object({
  ...importableProperties,
  password_hash: Type.Optional(PasswordHash)
}, {
  $id: 'UserImportItem',
  additionalProperties: false,
  description: 'A user to import: the fields of UserCreate, with either `password` (hashed here, the password rules apply) or `password_hash` (an existing hash, checked but never recomputed), or neither.'
})
export type UserImportItem = Static<typeof UserImportItem>

export const UserImport = Type.Object({
  users: Type.Array(ref(UserImportItem), { minItems: 1, maxItems: IMPORT_MAX_USERS, description: `1 to ${IMPORT_MAX_USERS} users.` }),
  atomic: Type.Optional(Type.Boolean({
    default: true,
    description: '`true` (default): all or nothing; if any item fails, nothing is created and the answer is 422 with the per-item report. ' +
      '`false`: every valid item is created and the failures are reported.'
  }))
}, { $id: 'UserImport', additionalProperties: false, description: 'A batch of users to create, for moving users from another system.' })
export type UserImport = Static<typeof UserImport>

export const UserImportItemResult = Type.Object({
  index: Type.Integer({ format: 'int32', minimum: 0, maximum: IMPORT_MAX_USERS - 1, description: 'Position of the item in `users`, from 0.' }),
  username: Type.String({ maxLength: 64, pattern: USERNAME_PATTERN, description: 'The item\'s username.' }),
  status: Type.Union([Type.Literal('created'), Type.Literal('error'), Type.Literal('not_created')], {
    description: '`created`; `error` (see `code` and `detail`); or `not_created`: valid, but the atomic import failed on another item.'
  }),
  id: Type.Optional(Uuid({ description: 'The new user\'s id, when created.' })),
  code: Type.Optional(Type.String({ maxLength: 64, pattern: '^[a-z][a-z_]*$', description: 'The error code (docs/errors.md), when `status` is `error`.', examples: ['password_hash_out_of_bounds'] })),
  detail: Type.Optional(Type.String({ maxLength: 1024, description: 'What is wrong with the item, for a person.' }))
}, { $id: 'UserImportItemResult', additionalProperties: false, description: 'What became of one item of an import.' })
export type UserImportItemResult = Static<typeof UserImportItemResult>

const ImportCounts = {
  atomic: Type.Boolean(),
  created: Type.Integer({ format: 'int32', minimum: 0, maximum: IMPORT_MAX_USERS, description: 'Users created.' }),
  failed: Type.Integer({ format: 'int32', minimum: 0, maximum: IMPORT_MAX_USERS, description: 'Items with `status: error`.' }),
  results: Type.Array(ref(UserImportItemResult), { maxItems: IMPORT_MAX_USERS, description: 'One per item, in the order sent.' })
}

export const UserImportResult = Type.Object(ImportCounts, {
  $id: 'UserImportResult',
  additionalProperties: false,
  description: 'The per-item report of an import that was applied (with `atomic: false`, some items may have failed).'
})
export type UserImportResult = Static<typeof UserImportResult>

export const Invitation = Type.Object({
  delivery: Type.Union([Type.Literal('queued'), Type.Literal('not_sent')], {
    description: '`queued`: the mail with the link and code is in the outbox, to be sent to the user\'s address (SMTP configured); whether it went ' +
      'shows on the user\'s console page, in the `mail.sent` or `mail.failed` event, and in `/readyz` `checks.mail`. `not_sent`: no mail (no SMTP); hand over `url` (or `code`) yourself.'
  }),
  mailed: Type.Boolean({ deprecated: true, description: 'The same as `delivery: "queued"` (it never meant delivered); use `delivery`.' }),
  expires_at: Timestamp({ description: 'When the link and code stop working (INVITATION_LIFETIME_HOURS, default 72 h).' }),
  url: Type.Optional(Type.String({ format: 'uri', maxLength: 2048, description: 'Only without SMTP: the one-time link to hand to the user. Shown once; resending makes a new one and ends this.' })),
  code: Type.Optional(Type.String({ maxLength: 16, pattern: '^[A-Z0-9]{4}-[A-Z0-9]{4}$', description: 'Only without SMTP: the short code the user may type at the invitation page instead of following the link.' }))
}, { $id: 'Invitation', additionalProperties: false, description: 'An invitation just issued (docs/email.md#invitations).' })
export type Invitation = Static<typeof Invitation>

export const UserCreated = Type.Object({
  ...User.properties,
  invitation: Type.Optional(ref(Invitation))
}, { $id: 'UserCreated', additionalProperties: false, description: 'The created user; with `invite: true`, also the invitation issued.' })
