module github.com/enterprise-ai/sdk-go

go 1.19
