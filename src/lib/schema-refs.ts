/** The schemas of `pool` (keyed by `$id`) that `schema` refers to through `$ref`, directly or through each other. */
export function referencedSchemas (schema: unknown, pool: Record<string, unknown>): Record<string, unknown> {
  const found: Record<string, unknown> = {}
  const visit = (node: unknown): void => {
    if (typeof node !== 'object' || node === null) return
    if (Array.isArray(node)) {
      for (const item of node) visit(item)
      return
    }
    for (const [key, value] of Object.entries(node)) {
      if (key === '$ref' && typeof value === 'string') {
        const id = value.split('#')[0]!
        if (id !== '' && !(id in found) && id in pool) {
          found[id] = pool[id]
          visit(pool[id])
        }
      } else {
        visit(value)
      }
    }
  }
  visit(schema)
  return found
}
