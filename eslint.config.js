import neostandard from 'neostandard'

export default [
  ...neostandard({ ts: true, ignores: ['node_modules/**', 'data/**', 'dist/**', 'bench/results/**', 'test/artifacts/**'] }),
  {
    rules: {
      // TypeBox's idiom: a schema and its static type share one name (`User` the schema, `User` the type).
      '@typescript-eslint/no-redeclare': 'off',
      // Template-literal SQL is how injections start; raw SQL goes through Kysely's `sql` tag.
      'no-restricted-syntax': ['error', {
        selector: "CallExpression[callee.property.name='raw'] > TemplateLiteral",
        message: 'Use the sql`` tag so values are bound, not interpolated.'
      }]
    }
  }
]
