import { sql, type Kysely } from 'kysely'
import { columnTypes } from '../database.ts'

export const phase = 'expand'

/**
 * SCIM's enterprise extension (RFC 7643 §4.3, docs/scim.md):
 * `employee_number`, `cost_center`, `organization`, `division`,
 * `department`, and `manager_id`, the user's manager when that is one of our
 * users. The user lifecycle clears a deleted manager's reports with an event
 * each; the foreign key's ON DELETE SET NULL only backs that up, so no read
 * ever finds a manager that is gone. `employeeNumber eq` and `department eq`
 * are the identity providers' matching filters: indexed on the case-folded
 * value they compare with, and `manager_id` for the reports of a manager.
 */
export async function up (db: Kysely<any>): Promise<void> {
  const { uuid } = columnTypes(db)
  for (const column of ['employee_number', 'cost_center', 'organization', 'division', 'department']) {
    await db.schema.alterTable('users').addColumn(column, 'text').execute()
  }
  await db.schema.alterTable('users').addColumn('manager_id', uuid, c => c.references('users.id').onDelete('set null')).execute()
  await db.schema.createIndex('users_employee_number_idx').on('users').expression(sql`lower(employee_number)`).execute()
  await db.schema.createIndex('users_department_idx').on('users').expression(sql`lower(department)`).execute()
  await db.schema.createIndex('users_manager_id_idx').on('users').column('manager_id').execute()
}

export async function down (db: Kysely<any>): Promise<void> {
  for (const index of ['users_manager_id_idx', 'users_department_idx', 'users_employee_number_idx']) await db.schema.dropIndex(index).execute()
  for (const column of ['manager_id', 'department', 'division', 'organization', 'cost_center', 'employee_number']) {
    await db.schema.alterTable('users').dropColumn(column).execute()
  }
}
